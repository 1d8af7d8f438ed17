"""transformers integration: a tiny random Llama (no download) with attn_implementation="rocmflash"
matches "sdpa" -- logits and a training step's gradients -- on CPU through the interpreter."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

import rocmflash.integrations.hf as rf_hf  # noqa: E402

pytestmark = [pytest.mark.usefixtures("interpret"), pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::RuntimeWarning"), pytest.mark.filterwarnings("ignore::UserWarning")]

TOL = {torch.float16: 1e-2, torch.bfloat16: 2e-2}


def _tiny_llama(dtype, seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2,  # GQA 2 (head dim 16)
                      max_position_embeddings=64, attention_dropout=0.0)
    return LlamaForCausalLM(cfg).to(dtype)


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def test_register_makes_the_name_valid_and_is_idempotent():
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    assert rf_hf.register() == "rocmfa" == rf_hf.DEFAULT_NAME  # the name without "flash" in it
    assert rf_hf.register() == "rocmfa"
    assert rf_hf.register("rocmflash") == "rocmflash"
    for name in ("rocmfa", "rocmflash"):  # the first name stays registered
        assert name in AttentionInterface._global_mapping
        assert name in AttentionMaskInterface._global_mapping  # else transformers drops the causal mask


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_tiny_llama_logits_and_gradients_match_sdpa(dtype):
    rf_hf.register()
    model = _tiny_llama(dtype)
    ids = torch.randint(0, 96, (2, 21))
    labels = torch.randint(0, 96, (2, 21))

    def run(impl):
        model.set_attn_implementation(impl)
        model.zero_grad(set_to_none=True)
        out = model(input_ids=ids, labels=labels)
        out.loss.backward()
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        return out.logits.detach().float(), grads

    before = rf_hf.stats()["rocmflash"]
    ref_logits, ref_grads = run("sdpa")
    logits, grads = run("rocmflash")
    assert rf_hf.stats()["rocmflash"] - before == 2  # both layers ran rocmflash (forward)
    assert torch.isfinite(logits).all()
    assert _rel(logits, ref_logits) < TOL[dtype]
    assert grads.keys() == ref_grads.keys()
    for name in ref_grads:  # every parameter, the attention projections included
        assert torch.isfinite(grads[name]).all(), name
        assert _rel(grads[name], ref_grads[name]) < TOL[dtype], name


@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_batch_runs_varlen_and_matches_sdpa(side):
    """Padding masks go through the varlen kernel: logits on real tokens and gradients match SDPA."""
    rf_hf.register()
    model = _tiny_llama(torch.bfloat16, seed=1)
    ids = torch.randint(0, 96, (3, 12))
    mask = torch.ones(3, 12, dtype=torch.long)
    if side == "left":
        mask[0, :5] = 0
        mask[2, :1] = 0
    else:
        mask[0, 7:] = 0
        mask[1, 11:] = 0
    labels = ids.masked_fill(mask == 0, -100)

    def run(impl):
        model.set_attn_implementation(impl)
        model.zero_grad(set_to_none=True)
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
        out.loss.backward()
        return out.logits.detach().float(), {n: p.grad.clone() for n, p in model.named_parameters()
                                             if p.grad is not None}

    ref, ref_grads = run("sdpa")
    before = rf_hf.stats()
    out, grads = run("rocmflash")
    after = rf_hf.stats()
    assert after["rocmflash"] - before["rocmflash"] == 2 and after["sdpa"] == before["sdpa"]
    real = mask.bool()
    assert _rel(out[real], ref[real]) < TOL[torch.bfloat16]
    for name in ref_grads:
        assert _rel(grads[name], ref_grads[name]) < 2 * TOL[torch.bfloat16], name


def test_padded_layout_rejects_other_masks():
    """A mask that is not padding + causal (here: one query may not see its own token) is refused."""
    B, S = 2, 6
    causal = torch.ones(S, S, dtype=torch.bool).tril()
    mask = causal.expand(B, 1, S, S).clone()
    assert rf_hf.padded_layout(mask, S, S, True, -1) is not None
    assert rf_hf.padded_layout(mask, S, S, False, -1) is None  # bidirectional asked, causal given
    holes = mask.clone()
    holes[1, 0, 4, 2] = False
    assert rf_hf.padded_layout(holes, S, S, True, -1) is None
    window = mask & torch.ones(S, S, dtype=torch.bool).triu(-2)
    assert rf_hf.padded_layout(window, S, S, True, 2) is not None
    assert rf_hf.padded_layout(window, S, S, True, -1) is None
    assert rf_hf.padded_layout(mask.float(), S, S, True, -1) is None  # additive masks: not read


def test_custom_mask_falls_back_with_one_warning():
    """A 4-D mask rocmflash cannot express runs transformers' SDPA, same bits, with a warning naming why."""
    rf_hf.register()
    rf_hf._WARNED.clear()
    model = _tiny_llama(torch.float16, seed=4)
    ids = torch.randint(0, 96, (1, 8))
    mask = torch.ones(1, 1, 8, 8, dtype=torch.bool).tril()
    mask[0, 0, 5, 1] = False  # a hole: not padding, not a window
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=mask).logits
    model.set_attn_implementation("rocmflash")
    with pytest.warns(RuntimeWarning, match="not padding"):
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=mask).logits
    assert torch.equal(out, ref)


def _padded_generate(seed: int, padded_row: int, pad: int, new: int, **kwargs):
    """Greedy generate() of a 2-sequence batch with ``pad`` left-padding tokens in ``padded_row``, through
    "sdpa" then "rocmflash": ``(sdpa tokens, rocmflash tokens, rocmflash's routing counters)``."""
    rf_hf.register()
    model = _tiny_llama(torch.float32, seed=seed).to(torch.bfloat16)
    ids = torch.randint(1, 96, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[padded_row, :pad] = 0
    ids[padded_row, :pad] = 0

    def gen(impl):
        model.set_attn_implementation(impl)
        with torch.no_grad():
            return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, do_sample=False,
                                  pad_token_id=0, **kwargs)

    ref = gen("sdpa")
    before = rf_hf.stats()
    out = gen("rocmflash")
    after = rf_hf.stats()
    return ref, out, {k: after[k] - before[k] for k in after}


def test_generate_with_left_padding_gives_sdpa_tokens():
    """Greedy generate() of a left-padded batch: the same tokens as attn_implementation="sdpa"."""
    ref, out, routed = _padded_generate(5, 1, 3, 8)
    assert routed["sdpa"] == 0 and routed["rocmflash"] == 2 * 8
    # the 7 one-token steps ran the decode kernel with each sequence's first key (cache_leftpad)
    assert routed["decode"] == 2 * 7
    assert torch.equal(out, ref)


def test_decode_key_range_reads_one_run_of_keys_per_row():
    """A one-token step's mask: one run of keys per row (left padding before it, a static cache's free
    slots after it, a left window) gives each run's (start, end); anything else None."""
    B, S = 3, 9

    def rng(mask, window=-1):
        got = rf_hf.decode_key_range(mask, B, S, window)
        return None if got is None else (got[0].tolist(), got[1].tolist())

    mask = torch.ones(B, 1, 1, S, dtype=torch.bool)
    mask[1, ..., :4] = False
    mask[2, ...] = False  # a row with no key: the empty run [0, 0)
    assert rng(mask) == ([0, 4, 0], [S, S, 0])
    static = mask.clone()
    static[:2, ..., 7:] = False  # a static cache: slots 7, 8 not written yet
    assert rng(static) == ([0, 4, 0], [7, 7, 0])
    window = mask.clone()
    window[:2, ..., :5] = False  # window_left 3: keys 5..8 of the last position 8, padding or not
    assert rng(window, 3) == ([5, 5, 0], [S, S, 0])
    assert rng(window) == ([5, 5, 0], [S, S, 0])  # also reads as padding
    assert rng(mask, 3) is None  # keys outside the window are not masked
    holes = torch.ones(B, 1, 1, S, dtype=torch.bool)
    holes[1, ..., 3] = False
    assert rng(holes) is None  # two runs: the varlen route
    assert rf_hf.decode_key_range(mask.float(), B, S, -1) is None  # additive masks: not read
    assert rf_hf.decode_key_range(mask, B, S + 1, -1) is None  # another shape


def test_generate_with_static_cache_and_left_padding_gives_sdpa_tokens():
    """A static cache (free slots after each sequence) with left padding: the prefill on the varlen kernel
    over the written keys (the free slots cut off), the 5 one-token steps on the decode kernel."""
    ref, out, routed = _padded_generate(9, 0, 2, 6, cache_implementation="static")
    assert routed["sdpa"] == 0 and routed["rocmflash"] == 2 * 6
    assert routed["decode"] == 2 * 5
    assert torch.equal(out, ref)


def test_a_padded_forward_reads_its_mask_once(monkeypatch):
    """transformers passes every layer the same mask tensor: its layout is read by the first layer only
    (each read waits for the GPU), and again after an in-place change."""
    rf_hf.register()
    model = _tiny_llama(torch.bfloat16, seed=6)
    model.set_attn_implementation("rocmflash")
    calls = []
    original = rf_hf.padded_layout
    monkeypatch.setattr(rf_hf, "padded_layout", lambda *a: calls.append(1) or original(*a))
    ids = torch.randint(1, 96, (2, 11))
    mask = torch.ones(2, 11, dtype=torch.long)
    mask[0, :4] = 0
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
        assert len(calls) == 1  # 2 layers, one read
        model(input_ids=ids, attention_mask=mask)
        assert len(calls) == 2  # a new forward builds a new mask tensor

    # the cache is keyed on the tensor and its version counter
    m4 = torch.ones(2, 1, 5, 5, dtype=torch.bool).tril()
    first = rf_hf._mask_plan(m4, ("probe",), lambda: object())
    assert rf_hf._mask_plan(m4, ("probe",), lambda: object()) is first
    m4[0, 0, 0, 0] = True  # in place: the version moves
    assert rf_hf._mask_plan(m4, ("probe",), lambda: object()) is not first


def test_generate_with_kv_cache_matches_sdpa():
    """Prefill (causal, Sq == Sk) and decode steps (one query, no mask) both run through rocmflash."""
    rf_hf.register()
    model = _tiny_llama(torch.float16, seed=2)
    ids = torch.randint(0, 96, (1, 9))
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        ref = model(input_ids=ids).logits
        past = model(input_ids=ids[:, :-1], use_cache=True).past_key_values
    model.set_attn_implementation("rocmflash")
    before, before_decode = rf_hf.stats()["rocmflash"], rf_hf.stats()["decode"]
    with torch.no_grad():
        out = model(input_ids=ids[:, :-1], use_cache=True)
        step = model(input_ids=ids[:, -1:], past_key_values=out.past_key_values, use_cache=True).logits
    assert rf_hf.stats()["rocmflash"] - before == 4
    assert rf_hf.stats()["decode"] - before_decode == 2  # the one-token step ran the decode kernel (2 layers)
    assert _rel(step[:, -1].float(), ref[:, -1].float()) < 1e-2
    assert past is not None


def test_tiny_llama_compiles_fullgraph():
    """torch.compile(model, fullgraph=True) traces the model with rocmflash attention, forward and backward
    (backend aot_eager on CPU; Inductor on the GPU tests)."""
    rf_hf.register()
    model = _tiny_llama(torch.bfloat16, seed=3)
    model.set_attn_implementation("rocmflash")
    ids = torch.randint(0, 96, (2, 17))
    torch._dynamo.reset()
    try:
        eager = model(input_ids=ids, labels=ids)
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")(input_ids=ids, labels=ids)
        compiled.loss.backward()
        assert torch.allclose(compiled.logits, eager.logits)
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    finally:
        torch._dynamo.reset()


def test_generate_without_padding_uses_the_decode_kernel():
    """Greedy generate() of an unpadded batch: prefill on the dense kernel, every step on the decode kernel."""
    rf_hf.register()
    model = _tiny_llama(torch.float32, seed=8).to(torch.bfloat16)
    ids = torch.randint(1, 96, (2, 6))

    def gen(impl):
        model.set_attn_implementation(impl)
        with torch.no_grad():
            return model.generate(input_ids=ids, max_new_tokens=6, do_sample=False, pad_token_id=0)

    ref = gen("sdpa")
    before = rf_hf.stats()
    out = gen("rocmflash")
    after = rf_hf.stats()
    assert after["decode"] - before["decode"] == 2 * 5  # 5 one-token steps x 2 layers
    assert after["sdpa"] == before["sdpa"]
    assert torch.equal(out, ref)
