"""Two GPUs: every entry point with its tensors on ``cuda:1`` while ``cuda:0`` is current (HF ``device_map``,
pipeline stages), forward and backward, against an fp32 reference on the same GPU; then the same
shapes on ``cuda:0`` (launch plans are per device). Skipped unless two CUDA/ROCm devices are visible."""

import math

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("compiled")]


@pytest.fixture
def second_gpu():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    torch.cuda.set_device(0)
    yield torch.device("cuda", 1)
    assert torch.cuda.current_device() == 0, "a call left another GPU current"


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _ref(q, k, v, scale, causal=False, window=(-1, -1)):
    """fp32 SDPA on (B, S, H, D) inputs with a bottom-right causal/window mask; returns (B, Sq, Hq, D)."""
    q, k, v = (t.float().transpose(1, 2) for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    Sq, Sk = q.shape[2], k.shape[2]
    i = torch.arange(Sq, device=q.device)[:, None] + (Sk - Sq)
    j = torch.arange(Sk, device=q.device)[None, :]
    keep = torch.ones(Sq, Sk, dtype=torch.bool, device=q.device)
    left, right = window
    right = 0 if causal else right
    if left >= 0:
        keep &= j >= i - left
    if right >= 0:
        keep &= j <= i + right
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep, scale=scale)
    return out.transpose(1, 2)


def _qkv(device, B=2, Sq=300, Sk=300, Hq=8, Hkv=2, D=128, grad=True):
    g = torch.Generator(device=device).manual_seed(Sq * 7 + Sk)
    mk = lambda S, H: torch.randn(B, S, H, D, device=device, generator=g, dtype=torch.bfloat16)  # noqa: E731
    q, k, v = mk(Sq, Hq), mk(Sk, Hkv), mk(Sk, Hkv)
    return [t.requires_grad_(grad) for t in (q, k, v)]


def _check_fwd_bwd(fn, device, window=(-1, -1), causal=True):
    q, k, v = _qkv(device)
    out = fn(q, k, v)
    assert out.device == device
    ref_in = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    ref = _ref(*ref_in, 1 / math.sqrt(q.shape[-1]), causal, window)
    assert _rel(out, ref) < 2e-2
    dout = torch.randn_like(out)
    out.backward(dout)
    ref.backward(dout.float())
    for got, want in zip((q.grad, k.grad, v.grad), (t.grad for t in ref_in)):
        assert got.device == device and _rel(got, want) < 3e-2


@pytest.mark.parametrize("entry", ["attention", "flash_attn_func", "flash_attn_func+window"])
def test_dense_entry_points_on_the_second_gpu(second_gpu, entry):
    import rocmflash

    fns = {
        "attention": lambda q, k, v: rocmflash.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                         causal=True).transpose(1, 2),
        "flash_attn_func": lambda q, k, v: rocmflash.flash_attn_func(q, k, v, causal=True),
        "flash_attn_func+window": lambda q, k, v: rocmflash.flash_attn_func(q, k, v, causal=True, window_size=(64, 0)),
    }
    window = (64, 0) if "window" in entry else (-1, -1)
    for device in (second_gpu, second_gpu, torch.device("cuda", 0)):  # twice: the replayed launch plan too
        _check_fwd_bwd(fns[entry], device, window)


def test_varlen_on_the_second_gpu(second_gpu):
    from rocmflash import flash_attn_varlen_func

    for device in (second_gpu, second_gpu, torch.device("cuda", 0)):
        lens = [5, 300, 77]
        cu = torch.tensor([0, 5, 305, 382], dtype=torch.int32, device=device)
        q, k, v = (t[0, :382] for t in _qkv(device, B=1, Sq=382, Sk=382, grad=False))
        q, k, v = (t.clone().requires_grad_(True) for t in (q, k, v))
        out = flash_attn_varlen_func(q, k, v, cu, cu, 300, 300, causal=True)
        assert out.device == device
        start = 0
        dout = torch.randn_like(out)
        out.backward(dout)
        for n in lens:
            sl = slice(start, start + n)
            qi, ki, vi = (t.detach()[sl][None].clone().requires_grad_(True) for t in (q, k, v))
            ref = _ref(qi, ki, vi, 1 / math.sqrt(128), causal=True)[0]
            assert _rel(out[sl], ref) < 2e-2
            ref.backward(dout[sl].float())
            assert _rel(q.grad[sl], qi.grad[0]) < 3e-2 and _rel(k.grad[sl], ki.grad[0]) < 3e-2
            start += n


@pytest.mark.parametrize("paged", [False, True])
def test_kvcache_on_the_second_gpu(second_gpu, paged):
    from rocmflash import flash_attn_with_kvcache

    for device in (second_gpu, second_gpu, torch.device("cuda", 0)):
        B, S, Hq, Hkv, D = 4, 2048, 32, 8, 128
        g = torch.Generator(device=device).manual_seed(3)
        k_all = torch.randn(B, S, Hkv, D, device=device, generator=g, dtype=torch.bfloat16)
        v_all = torch.randn(B, S, Hkv, D, device=device, generator=g, dtype=torch.bfloat16)
        q = torch.randn(B, 1, Hq, D, device=device, generator=g, dtype=torch.bfloat16)
        lens = torch.tensor([2047, 1000, 1, 513], dtype=torch.int32, device=device)
        k_new, v_new = k_all[:, :1].clone(), v_all[:, :1].clone()
        if paged:
            page = 256
            perm = torch.randperm(B * S // page, device=device)
            table = perm.view(B, S // page).to(torch.int32)
            kc = torch.empty(B * S // page, page, Hkv, D, device=device, dtype=torch.bfloat16)
            vc = torch.empty_like(kc)
            kc[table.flatten().long()] = k_all.view(B * S // page, page, Hkv, D)
            vc[table.flatten().long()] = v_all.view(B * S // page, page, Hkv, D)
            out = flash_attn_with_kvcache(q, kc, vc, k_new, v_new, cache_seqlens=lens, block_table=table, causal=True)
        else:
            kc, vc = k_all.clone(), v_all.clone()
            out = flash_attn_with_kvcache(q, kc, vc, k_new, v_new, cache_seqlens=lens, causal=True)
        assert out.device == device
        for b in range(B):
            n = int(lens[b])
            keys = torch.cat([k_all[b:b + 1, :n], k_new[b:b + 1]], 1)
            vals = torch.cat([v_all[b:b + 1, :n], v_new[b:b + 1]], 1)
            ref = _ref(q[b:b + 1], keys, vals, 1 / math.sqrt(D), causal=True)
            assert _rel(out[b:b + 1], ref) < 2e-2, (device, b)


def _llama(device):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=1024, hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
                                   num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=4096)
    with torch.device(device):
        return transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)


def test_hf_model_on_the_second_gpu(second_gpu):
    """A whole model on cuda:1 (cuda:0 current): a training step's loss and greedy generate() of a
    left-padded batch (prefill on the varlen kernel, steps on the decode kernel) agree with SDPA."""
    import rocmflash.integrations.hf as rf_hf

    rf_hf.register()
    model = _llama(second_gpu)
    ids = torch.randint(1, 1024, (4, 64), device=second_gpu)
    mask = torch.ones_like(ids)
    for b, n in enumerate((0, 5, 17, 40)):
        mask[b, :n] = 0
        ids[b, :n] = 0

    def run(impl):
        model.set_attn_implementation(impl)
        model.zero_grad(set_to_none=True)
        loss = model(input_ids=ids[:1], labels=ids[:1]).loss
        loss.backward()
        with torch.no_grad():
            tokens = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8, do_sample=False,
                                    pad_token_id=0)
        return loss.item(), tokens

    ref_loss, ref_tokens = run("sdpa")
    before = rf_hf.stats()["rocmflash"]
    loss, tokens = run("rocmflash")
    assert rf_hf.stats()["rocmflash"] > before
    assert abs(loss - ref_loss) < 2e-2 * abs(ref_loss)
    assert (tokens == ref_tokens).float().mean().item() > 0.9


def test_hf_device_map_across_two_gpus(second_gpu, tmp_path):
    """``from_pretrained(device_map=...)``: the first layers on cuda:0, the rest on cuda:1 (needs accelerate)."""
    pytest.importorskip("accelerate")
    import transformers

    import rocmflash.integrations.hf as rf_hf

    rf_hf.register()
    _llama("cpu").save_pretrained(tmp_path)
    layout = {"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": 0, "model.layers.2": 1,
              "model.layers.3": 1, "model.norm": 1, "model.rotary_emb": 1, "lm_head": 1}
    ids = torch.randint(1, 1024, (2, 200), device="cuda:0")
    logits = {}
    for impl in ("sdpa", "rocmflash"):
        model = transformers.LlamaForCausalLM.from_pretrained(tmp_path, device_map=layout, torch_dtype=torch.bfloat16,
                                                              attn_implementation=impl)
        with torch.no_grad():
            logits[impl] = model(input_ids=ids).logits.float()
            if impl == "rocmflash":
                out = model.generate(input_ids=ids, max_new_tokens=4, do_sample=False)
                assert out.shape == (2, 204)
    assert _rel(logits["rocmflash"], logits["sdpa"]) < 2e-2
