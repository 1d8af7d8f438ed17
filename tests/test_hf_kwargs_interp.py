"""transformers integration: every keyword argument the attention function is handed is honoured or refused with
a one-line error naming it (never dropped, never a silent SDPA fallback), and the name without "flash"
(``"rocmfa"``) is the one the families listing their own flash kernels (gpt-oss, ...) can load. CPU, Triton's
interpreter; attention calls on small random tensors."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

import rocmflash.integrations.hf as rf_hf  # noqa: E402

pytestmark = [pytest.mark.usefixtures("interpret"), pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::RuntimeWarning"), pytest.mark.filterwarnings("ignore::UserWarning")]


class _Module(torch.nn.Module):
    is_causal = True
    num_key_value_groups = 2


def _qkv(dtype=torch.float16, B=1, S=8):
    torch.manual_seed(0)
    q = torch.randn(B, 4, S, 16, dtype=dtype)
    k = torch.randn(B, 2, S, 16, dtype=dtype)
    return q, k, torch.randn_like(k)


def _call(*, dtype=torch.float16, mask=None, **kwargs):
    q, k, v = _qkv(dtype)
    return rf_hf.rocmflash_attention_forward(_Module(), q, k, v, mask, scaling=0.25, **kwargs)


@pytest.mark.parametrize("name", ["s_aux", "sinks"])
def test_attention_sinks_are_honoured_and_never_fall_back(name):
    """gpt-oss's sinks run rocmflash's kernel (equal to rocmflash.attention with the same sinks); where the call
    would fall back (fp32), SDPA would ignore them: a one-line error naming them. Bad sinks are one line too."""
    import rocmflash

    q, k, v = _qkv()
    sinks = torch.randn(4)
    out, _ = _call(**{name: sinks})
    ref = rocmflash.attention(q, k, v, causal=True, softmax_scale=0.25, sinks=sinks).transpose(1, 2)
    assert torch.equal(out, ref)
    assert not torch.equal(out, _call()[0])  # the sinks changed the answer
    with pytest.raises(ValueError, match=r"attention sinks \(" + name):
        _call(dtype=torch.float32, **{name: sinks})
    with pytest.raises(ValueError, match=r"shape \(Hq,\) = \(4,\)"):
        _call(**{name: torch.zeros(3)})
    with pytest.raises(ValueError, match="both s_aux and sinks"):
        _call(s_aux=sinks, sinks=sinks)


def test_unknown_and_unservable_kwargs_are_refused_by_name():
    with pytest.raises(ValueError, match="'block_table'"):
        _call(block_table=torch.zeros(1, 1, dtype=torch.int32))
    with pytest.raises(ValueError, match="output_attentions=True"):
        _call(output_attentions=True)
    with pytest.raises(ValueError, match="missing cu_seq_lens_k, max_length_q, max_length_k"):
        _call(cu_seq_lens_q=torch.tensor([0, 8], dtype=torch.int32))
    with pytest.raises(TypeError, match="deterministic must be a bool"):
        _call(mask=torch.ones(1, 1, 8, 8, dtype=torch.bool).tril(), deterministic="yes")
    # the model-level arguments that are not attention's are accepted (and change nothing)
    out, _ = _call(use_cache=True, output_attentions=False, output_hidden_states=True, num_items_in_batch=3)
    assert torch.equal(out, _call()[0])


def test_a_fallback_that_sdpa_would_get_wrong_is_refused():
    """fp32 is SDPA's (rocmflash runs fp16/bf16), but SDPA would ignore soft-capping, packing kwargs, a window
    without a mask over more keys, and sequences packed by position_ids: those are errors, not fallbacks."""
    cu = torch.tensor([0, 5, 8], dtype=torch.int32)
    cases = [(dict(softcap=5.0), "softcap"),
             (dict(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=5, max_length_k=5), "packing kwargs"),
             (dict(sliding_window=3), "sliding window"),
             (dict(position_ids=torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2]])), "packed sequences of position_ids")]
    for kwargs, words in cases:
        with pytest.raises(ValueError, match=words):
            _call(dtype=torch.float32, **kwargs)
    before = rf_hf.stats()["sdpa"]
    _call(dtype=torch.float32, sliding_window=8, position_ids=torch.arange(8)[None])  # all of it SDPA's
    assert rf_hf.stats()["sdpa"] == before + 1


def test_a_mask_that_contradicts_the_packing_kwargs_is_refused():
    cu = torch.tensor([0, 5, 8], dtype=torch.int32)
    causal = torch.ones(1, 1, 8, 8, dtype=torch.bool).tril()  # one sequence of 8, the kwargs say 5 + 3
    with pytest.raises(ValueError, match="not their packed sequences"):
        _call(mask=causal, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=5, max_length_k=5)


def test_packing_kwargs_run_the_varlen_kernel_per_sequence():
    """The kwargs' sequences attend only within themselves (against rocmflash's varlen API on each alone), with a
    mask that is their block-diagonal band or none; equal (torch.equal) with and without the mask."""
    from rocmflash import flash_attn_func

    q, k, v = _qkv()
    cu = torch.tensor([0, 5, 8], dtype=torch.int32)
    kw = dict(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=5, max_length_k=5)
    seq = torch.tensor([0] * 5 + [1] * 3)
    block = ((seq[:, None] == seq[None, :]) & torch.ones(8, 8, dtype=torch.bool).tril())[None, None]
    before = rf_hf.stats()["packed"]
    out, _ = _call(**kw)
    masked, _ = _call(mask=block, **kw)
    assert rf_hf.stats()["packed"] == before + 2
    assert torch.equal(out, masked)
    bshd = [t.transpose(1, 2) for t in (q, k, v)]
    for a, b in ((0, 5), (5, 8)):
        ref = flash_attn_func(*[t[:, a:b] for t in bshd], softmax_scale=0.25, causal=True)
        assert torch.equal(out[:, a:b], ref)


def test_gpt_oss_loads_under_rocmfa_not_rocmflash():
    """gpt-oss lists compatible flash kernels: "rocmflash" (contains "flash") would be swapped for a hub kernel, so
    it is a one-line error naming "rocmfa"; "rocmfa" loads and runs its sinks on rocmflash's kernels."""
    cfg = transformers.GptOssConfig(vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
                                    num_experts_per_tok=2, sliding_window=4)
    name = rf_hf.register()
    with pytest.raises(ValueError, match="use attn_implementation='rocmfa'"):
        transformers.GptOssForCausalLM._from_config(cfg, attn_implementation="rocmflash")
    model = transformers.GptOssForCausalLM._from_config(cfg, attn_implementation=name).half()
    assert model.config._attn_implementation == "rocmfa"
    with pytest.raises(ValueError, match="'rocmfa'"):
        model.set_attn_implementation("rocmflash")
    before = rf_hf.stats()
    with torch.no_grad():
        logits = model(input_ids=torch.randint(0, 64, (1, 6))).logits
    assert torch.isfinite(logits).all()
    assert rf_hf.stats()["rocmflash"] - before["rocmflash"] == 2 and rf_hf.stats()["sdpa"] == before["sdpa"]


def test_rocmflash_still_loads_the_other_families():
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2)
    rf_hf.register()
    model = transformers.LlamaForCausalLM._from_config(cfg, attn_implementation="rocmflash")
    assert model.config._attn_implementation == "rocmflash"
