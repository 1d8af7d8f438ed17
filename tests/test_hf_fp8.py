"""transformers ``generate()`` with an fp8 KV cache (``rocmflash.integrations.hf_fp8.Fp8Cache``) served by the decode
kernel's fp8 path: a tiny random Llama (no download) on CPU through Triton's interpreter.

What is checked, and against what:

* the cache's bytes are torch's quantisation of each layer's K/V (``(k / k_descale).clamp(-max, max).to(fp8)``)
  and the computed descales are ``amax / fp8_max`` of the prefill's K/V per (sequence, kv head);
* every decode step's attention output (each layer, each step, inside generate) is within the bound
  :func:`_attention_bound` derives from the fp8 format's rounding and saturation, of the fp64 attention over
  the *unquantised* K/V the cache was given (same q), plus the kernel's own bound (``test_fp8_kvcache``);
* generate's tokens and logits equal, within the kernels' rounding, a bf16 run over a cache holding the
  dequantised values (the fp8 cache is read exactly); the bf16 cache's logits within u8 of the row's largest
  logit (u8 = 2^-4 for e4m3, 2^-3 for e5m2; an allowance, see the test), and so the greedy tokens equal the bf16
  cache's wherever the bf16 run's top-2 margin is above twice that;
* bad input (the format for a faked arch, descales, the attention implementation, the cache's capacity) is a
  one-line error raised before anything is written.
"""

import math

import pytest
import torch

transformers = pytest.importorskip("transformers")

import rocmflash.integrations.hf as rf_hf  # noqa: E402
from rocmflash.hw.fp8 import fp8_max  # noqa: E402
from rocmflash.integrations.hf_fp8 import Fp8Cache, Fp8Layer  # noqa: E402
from rocmflash.kernels.decode.quant import LAYOUTS  # noqa: E402
from test_fp8_kvcache import _kernel_bound, _quantise  # noqa: E402
from varlen_reference import attention_fp64  # noqa: E402

pytestmark = [pytest.mark.usefixtures("interpret"), pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::RuntimeWarning"), pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning")]

ALL = (torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2, torch.float8_e5m2fnuz)
LAYERS, KV_HEADS, HEAD_DIM = 2, 2, 16


@pytest.fixture(autouse=True)
def _fresh():
    """No decode error bits or kept plans from another test (a kept plan skips the arch check)."""
    from rocmflash.api import decode as Dm
    from rocmflash.kernels.decode import host as KD
    from rocmflash.kernels.decode import checks as DC

    DC._ERROR_WORDS.clear()
    Dm.clear_cache()
    yield
    from rocmflash.api.decode import check_errors

    check_errors()  # nothing in any test was out of range or a bad scale
    DC._ERROR_WORDS.clear()
    Dm.clear_cache()


def _tiny_llama(seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=LAYERS,
                      num_attention_heads=4, num_key_value_heads=KV_HEADS,  # GQA 2, head dim 16
                      max_position_embeddings=64, attention_dropout=0.0)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.set_attn_implementation(rf_hf.register())
    return model


def _u8(dtype) -> float:
    return 2.0 ** -(LAYOUTS[dtype].mant + 1)


def _deq(x, descale):
    """An fp8 ``(B, H, S, D)`` tensor's values: ``x * descale[b, h]`` (fp32)."""
    return x.float() * descale[:, :, None, None]


def _torch_bytes(x, descale, dtype):
    """torch's quantisation of ``x (B, H, S, D)`` with ``descale (B, H)`` as uint8 ``(B, H, S, D)``."""
    return _quantise(x.transpose(1, 2), descale, dtype).transpose(1, 2).view(torch.uint8)


def _amax_descale(x, dtype):
    amax = x.float().abs().amax(dim=(2, 3))
    return torch.where(amax > 0, amax / fp8_max(dtype), torch.ones_like(amax))


@pytest.fixture
def recorded(monkeypatch):
    """Every Fp8Layer.update's input K/V, per layer object: ``{layer: [(k, v), ...]}``."""
    seen = {}
    original = Fp8Layer.update

    def update(self, key_states, value_states, *args, **kwargs):
        seen.setdefault(self, []).append((key_states.clone(), value_states.clone()))
        return original(self, key_states, value_states, *args, **kwargs)

    monkeypatch.setattr(Fp8Layer, "update", update)
    return seen


def _given_kv(recorded, layer):
    ks, vs = zip(*recorded[layer])
    return torch.cat(ks, 2), torch.cat(vs, 2)


def _generate(model, ids, mask=None, cache=None, new=6):
    with torch.no_grad():
        return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, do_sample=False, pad_token_id=0,
                              output_logits=True, return_dict_in_generate=True, cache=cache)


# ----------------------------------------------------------------------------- a reference cache
class _DequantisedLayer(transformers.cache_utils.DynamicLayer):
    """A bf16 cache layer holding the values an fp8 cache holds (torch's quantisation, dequantised: one bf16
    rounding more), prefill unquantised as Fp8Layer: generate over it is what the fp8 cache must compute."""

    def __init__(self, dtype):
        super().__init__()
        self.fp8, self.ks, self.vs = dtype, None, None

    def update(self, key_states, value_states, *args, **kwargs):
        first = self.get_seq_length() == 0
        if self.ks is None:
            self.ks, self.vs = _amax_descale(key_states, self.fp8), _amax_descale(value_states, self.fp8)
        kq, vq = ((_torch_bytes(x, s, self.fp8).view(self.fp8).float() * s[:, :, None, None]).to(x.dtype)
                  for x, s in ((key_states, self.ks), (value_states, self.vs)))
        keys, values = super().update(kq, vq)
        return (key_states, value_states) if first else (keys, values)


def _dequantised_cache(dtype):
    return transformers.cache_utils.Cache(layers=[_DequantisedLayer(dtype) for _ in range(LAYERS)])


def _prompt(batch=2, length=9, pad=0, seed=0):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 96, (batch, length), generator=gen)
    mask = torch.ones(batch, length, dtype=torch.long)
    if pad:
        mask[1, :pad] = 0
        ids[1, :pad] = 0
    return ids, mask


# ----------------------------------------------------------------------------- generate
@pytest.mark.parametrize("dtype,pad", [(torch.float8_e4m3fn, 0), (torch.float8_e4m3fnuz, 3), (torch.float8_e5m2, 3),
                                       (torch.float8_e5m2fnuz, 2)])
def test_generate_with_fp8_cache_follows_the_bf16_cache(dtype, pad):
    """Greedy generate() over an Fp8Cache (no padding: the decode kernel without a mask; left padding: with
    ``cache_leftpad``). Every one-token step of both layers runs the decode kernel's fp8 path.

    Against a bf16 cache holding the dequantised values (the fp8 cache's contents, one bf16 rounding more):
    only the kernels' rounding differs (bf16 P and output in one, fp16 in the other: a few 2^-8 relative),
    so the logits agree to 1e-2 relative (measured <= 7e-3) and the tokens are equal at every step.

    Against the plain bf16 cache (the quantisation error): the cache's values err by <= u8 relative (2^-4
    e4m3, 2^-3 e5m2), each attention output by about u8 max|v| to 2.5 u8 max|v| at these scores (the derived
    bound: :func:`_attention_bound`, tested per call below). The logits are allowed u8 times the row's largest
    logit -- the attention outputs' relative error carried through the residual stream and the LM head without
    amplification, an allowance asserted at every step (measured <= 0.86 u8: the padded row, which attends
    fewest keys, averages fewest rounding errors). Where the bf16 run's top-2 margin exceeds twice that
    allowance, the greedy tokens must agree.
    """
    model = _tiny_llama()
    ids, mask = _prompt(pad=pad)
    ref = _generate(model, ids, mask)
    exact = _generate(model, ids, mask, cache=_dequantised_cache(dtype))
    before = rf_hf.stats()
    cache = Fp8Cache(model.config, max_cache_len=16, dtype=dtype)
    out = _generate(model, ids, mask, cache=cache)
    after = rf_hf.stats()
    steps = len(out.logits)
    assert after["fp8"] - before["fp8"] == LAYERS * (steps - 1)  # every one-token step read the fp8 cache
    assert after["sdpa"] == before["sdpa"]
    assert cache.get_seq_length() == ids.shape[1] + steps - 1 and cache.dtype == dtype
    assert torch.equal(out.sequences, exact.sequences)
    for got, want in zip(out.logits, exact.logits):
        assert ((got.float() - want.float()).norm() / want.float().norm()).item() < 1e-2
    n = ids.shape[1]
    compared = 0
    for step in range(1, steps):  # step 0: the prefill's logits (its attention never reads the cache)
        got, want = out.logits[step].float(), ref.logits[step].float()
        allow = _u8(dtype) * want.abs().amax(-1)
        assert ((got - want).abs().amax(-1) <= allow).all(), step
        if not torch.equal(out.sequences[:, :n + step], ref.sequences[:, :n + step]):
            break  # the prefixes differ from here on: the runs are no longer comparable
        top = want.topk(2, -1).values
        sure = (top[:, 0] - top[:, 1]) > 2 * allow
        assert torch.equal(out.sequences[sure, n + step], ref.sequences[sure, n + step])
        compared += int(sure.sum())
    assert compared >= 2  # the margins allowed a few comparisons (else this test checks no token)


def _attention_bound(q, k, v, ks, vs, dtype, scale):
    """Bound on |out - ref| of one sequence's decode step, against the fp64 attention over the unquantised
    ``k``/``v`` ``(S, Hkv, D)``, from the cache's quantisation with descales ``ks``/``vs`` ``(Hkv,)``.

    Storing ``x`` with descale ``s`` errs by at most ``u8 |x| + s 2^(-bias-M)`` (round to nearest; the second
    term: half the subnormal quantum) plus ``max(0, |x| - s fp8_max)`` (saturation: a decode token larger than
    the prompt's amax). A score moves by at most ``E_j = scale sum_d |q_d| err(k_jd)``; with ``E = max_j E_j``
    every softmax weight moves by a factor in ``[e^-2E, e^2E]``, so the weights move by at most
    ``e^2E - 1`` in total, weighting ``|v'| <= |v| + err(v)``; V's own error adds ``max err(v)``.
    """
    lay = LAYOUTS[dtype]
    u8, sub, top = 2.0 ** -(lay.mant + 1), 2.0 ** (-lay.bias - lay.mant), fp8_max(dtype)

    def err(x, s):
        s = s.double()[None, :, None]
        return u8 * x.abs().double() + s * sub + (x.abs().double() - s * top).clamp(min=0)

    group = q.shape[1] // k.shape[1]
    e = scale * torch.einsum("qhd,khd->hqk", q.abs().double(), err(k, ks).repeat_interleave(group, 1))
    v_err = err(v, vs)
    v_max = (v.abs().double() + v_err).max().item()
    return torch.expm1(2 * e.amax(-1)).max().item() * v_max + v_err.max().item()


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2fnuz])
def test_decode_attention_within_the_quantisation_bound(dtype, recorded, monkeypatch):
    """Inside generate(), each one-token step's attention output (each layer) is within _attention_bound of
    the fp64 attention over the K/V the cache was given, unquantised (same q), plus the kernel's bound."""
    from transformers import AttentionInterface

    model = _tiny_llama(seed=2)
    ids, mask = _prompt(seed=2)
    cache = Fp8Cache(model.config, max_cache_len=16, dtype=dtype)
    checked = []

    def spied(module, query, key, value, *args, **kwargs):
        out, w = rf_hf.rocmflash_attention_forward(module, query, key, value, *args, **kwargs)
        if key.dtype == dtype:
            layer = cache.layers[module.layer_idx]
            k, v = _given_kv(recorded, layer)
            assert k.shape[2] == key.shape[2]
            k_deq = _deq(key, layer.k_descale)
            for b in range(query.shape[0]):
                qb, kb, vb = query[b].transpose(0, 1), k[b].transpose(0, 1), v[b].transpose(0, 1)
                ref, _ = attention_fp64(qb, kb, vb, module.scaling)
                bound = (_attention_bound(qb, kb, vb, layer.k_descale[b], layer.v_descale[b], dtype, module.scaling)
                         + _kernel_bound(_deq(value, layer.v_descale)[b], query.dtype, key.shape[2]))
                error = (out[b].double() - ref).abs().max().item()
                assert error <= bound, (module.layer_idx, key.shape[2], b, error, bound)
                checked.append(error / bound)
            assert torch.isfinite(k_deq).all()
        return out, w

    AttentionInterface.register(rf_hf.DEFAULT_NAME, spied)  # the name register() returned
    try:
        _generate(model, ids, mask, cache=cache, new=5)
    finally:
        rf_hf.register()
    assert len(checked) == LAYERS * 4 * ids.shape[0]
    assert max(checked) > 0.01  # the bound is not vacuous: it is within two orders of the error


def test_fp8_generate_reads_nothing_on_the_host(monkeypatch):
    """An unpadded generate() over an Fp8Cache: no cache update (quantising append, prefill descales) and no
    attention call reads a tensor on the host (a wait for the GPU on a GPU), as with a bf16 cache."""
    from test_varlen_no_sync import cpu_error_word, no_host_reads
    from transformers import AttentionInterface

    model = _tiny_llama(seed=6)
    ids, _ = _prompt(seed=6)
    reads = []
    original = Fp8Layer.update

    def spy(fn):
        def spied(*args, **kwargs):
            with no_host_reads(monkeypatch, cpu_error_word(), record=reads):
                return fn(*args, **kwargs)
        return spied

    monkeypatch.setattr(Fp8Layer, "update", spy(original))
    AttentionInterface.register(rf_hf.DEFAULT_NAME, spy(rf_hf.rocmflash_attention_forward))
    before = rf_hf.stats()["fp8"]
    try:
        _generate(model, ids, cache=Fp8Cache(model.config, max_cache_len=16), new=4)
    finally:
        rf_hf.register()
    assert rf_hf.stats()["fp8"] - before == LAYERS * 3
    assert reads == []


# ----------------------------------------------------------------------------- the cache's bytes
@pytest.mark.parametrize("dtype,given", [(torch.float8_e4m3fnuz, False), (torch.float8_e4m3fn, True),
                                         (torch.float8_e5m2, False)])
def test_cache_holds_torchs_quantisation_of_each_layers_kv(dtype, given, recorded):
    """After generate(), each layer's fp8 bytes are torch's quantisation of the K/V it was given (prompt and new
    tokens), with the descales given (per layer) or computed once from the prefill's K/V amax."""
    model = _tiny_llama(seed=3)
    ids, mask = _prompt(seed=3)
    scales = {}
    if given:
        gen = torch.Generator().manual_seed(0)
        scales = dict(k_descale=torch.rand(LAYERS, 2, KV_HEADS, generator=gen) * 0.01 + 0.002,
                      v_descale=torch.rand(LAYERS, 2, KV_HEADS, generator=gen) * 0.01 + 0.002)
    cache = Fp8Cache(model.config, max_cache_len=20, dtype=dtype, **scales)
    _generate(model, ids, mask, cache=cache, new=4)
    for i, layer in enumerate(cache.layers):
        k, v = _given_kv(recorded, layer)
        first_k, first_v = recorded[layer][0]
        assert first_k.shape[2] == ids.shape[1] and len(recorded[layer]) == 4
        if given:
            want_ks, want_vs = scales["k_descale"][i], scales["v_descale"][i]
        else:
            want_ks, want_vs = _amax_descale(first_k, dtype), _amax_descale(first_v, dtype)
        assert torch.equal(layer.k_descale, want_ks) and torch.equal(layer.v_descale, want_vs)
        n = k.shape[2]
        assert layer.get_seq_length() == n
        assert torch.equal(layer.keys[:, :, :n].contiguous().view(torch.uint8), _torch_bytes(k, want_ks, dtype))
        assert torch.equal(layer.values[:, :, :n].contiguous().view(torch.uint8), _torch_bytes(v, want_vs, dtype))


def test_beam_reorder_moves_bytes_and_scales(recorded):
    """reorder_cache (beam search) and batch selection move each sequence's bytes and descales together."""
    model = _tiny_llama(seed=4)
    ids, _ = _prompt(batch=3, length=5, seed=4)
    cache = Fp8Cache(model.config, max_cache_len=8, dtype=torch.float8_e4m3fn)
    with torch.no_grad():
        model(input_ids=ids, cache=cache)
    layer = cache.layers[1]
    before = layer.keys[:, :, :5].contiguous().view(torch.uint8).clone(), layer.k_descale.clone()
    order = torch.tensor([2, 0, 0])
    cache.reorder_cache(order)
    assert torch.equal(layer.keys[:, :, :5].contiguous().view(torch.uint8), before[0][order])
    assert torch.equal(layer.k_descale, before[1][order]) and cache.batch_size == 3
    cache.batch_select_indices(torch.tensor([1]))
    assert torch.equal(layer.k_descale, before[1][[0]]) and cache.batch_size == 1


def test_calls_the_decode_kernel_does_not_serve_read_the_dequantised_cache():
    """A multi-token forward over a filled fp8 cache (a continued prompt) runs on the cache's values in q's
    dtype: the logits of the bf16 cache holding the dequantised values, bit for bit (same routes, same inputs)."""
    model = _tiny_llama(seed=5)
    ids, _ = _prompt(length=11, seed=5)
    before = rf_hf.stats()
    logits = []
    for cache in (Fp8Cache(model.config, max_cache_len=16, dtype=torch.float8_e4m3fn),
                  _dequantised_cache(torch.float8_e4m3fn)):
        with torch.no_grad():
            model(input_ids=ids[:, :7], cache=cache)
            logits.append(model(input_ids=ids[:, 7:], cache=cache).logits)
    assert rf_hf.stats()["fp8"] == before["fp8"]  # nothing here is a one-token step
    assert torch.equal(logits[0], logits[1])


# ----------------------------------------------------------------------------- bad input
def _one_line(info, *words):
    msg = str(info.value)
    assert "\n" not in msg and all(w in msg for w in words), msg


@pytest.mark.parametrize("arch,dtype,words", [
    ("gfx942", torch.float8_e4m3fn, ["gfx942", "FNUZ", "float8_e4m3fnuz", "Fp8Cache"]),
    ("gfx950", torch.float8_e5m2fnuz, ["gfx950", "OCP", "float8_e5m2"]),
    ("gfx90a", None, ["gfx90a", "no fp8"]),
    ("sm_80", torch.float8_e4m3fn, ["sm_80", "no fp8"]),
])
def test_wrong_format_for_the_arch_is_refused(monkeypatch, arch, dtype, words):
    """With ``device``: at construction. Without: at the first forward, before a buffer is allocated."""
    from rocmflash.api import selection

    monkeypatch.setattr(selection, "device_identity", lambda device: (None, arch))
    model = _tiny_llama()
    with pytest.raises(TypeError) as info:
        Fp8Cache(model.config, max_cache_len=16, dtype=dtype, device="cpu")
    _one_line(info, *words)
    cache = Fp8Cache(model.config, max_cache_len=16, dtype=dtype)
    ids, mask = _prompt()
    with pytest.raises(TypeError) as info:
        _generate(model, ids, mask, cache=cache)
    _one_line(info, *words)
    assert all(layer._k is None for layer in cache.layers) and cache.get_seq_length() == 0


@pytest.mark.parametrize("arch,dtype", [("gfx942", torch.float8_e4m3fnuz), ("gfx950", torch.float8_e4m3fn),
                                        ("sm_90", torch.float8_e4m3fn), (None, torch.float8_e4m3fn)])
def test_default_format_is_the_archs_e4m3(monkeypatch, arch, dtype):
    from rocmflash.api import selection

    monkeypatch.setattr(selection, "device_identity", lambda device: (None, arch))
    model = _tiny_llama()
    assert Fp8Cache(model.config, max_cache_len=16, device="cpu").dtype == dtype
    cache = Fp8Cache(model.config, max_cache_len=16)
    assert cache.dtype is None
    with torch.no_grad():
        model(input_ids=_prompt(length=4)[0], cache=cache)
    assert cache.dtype == dtype and cache.layers[0].keys.dtype == dtype


def _scale(*shape, dtype=torch.float32, value=0.01):
    return torch.full(shape, value, dtype=dtype)


@pytest.mark.parametrize("kwargs,exc,words", [
    (dict(dtype=torch.bfloat16), TypeError, ["Fp8Cache.dtype", "fp8", "bfloat16"]),
    (dict(max_cache_len=0), ValueError, ["max_cache_len", "positive"]),
    (dict(k_descale=_scale(2, KV_HEADS)), ValueError, ["k_descale and v_descale together"]),
    (dict(k_descale=_scale(2, KV_HEADS, dtype=torch.float64), v_descale=_scale(2, KV_HEADS)), TypeError,
     ["k_descale.dtype", "float32", "float64"]),
    (dict(k_descale=_scale(2, 3), v_descale=_scale(2, 3)), ValueError, ["k_descale", "(batch, 2)", "(2, 3)"]),
    (dict(k_descale=_scale(3, 2, KV_HEADS), v_descale=_scale(3, 2, KV_HEADS)), ValueError, ["2 layers", "(3, 2, 2)"]),
    (dict(k_descale=_scale(2, KV_HEADS), v_descale=_scale(2, KV_HEADS, value=float("nan"))), ValueError,
     ["v_descale[0, 0, 0]", "nan", "finite and > 0"]),
    (dict(k_descale=_scale(2, KV_HEADS, value=0.0), v_descale=_scale(2, KV_HEADS)), ValueError,
     ["k_descale", "finite and > 0"]),
    (dict(k_descale=[0.1], v_descale=[0.1]), TypeError, ["k_descale must be a torch.Tensor", "list"]),
])
def test_bad_constructor_arguments(kwargs, exc, words):
    model = _tiny_llama()
    kwargs = dict(dict(max_cache_len=16), **kwargs)
    with pytest.raises(exc) as info:
        Fp8Cache(model.config, **kwargs)
    _one_line(info, *words)


def test_descales_for_another_batch_are_refused_before_anything_is_written():
    model = _tiny_llama()
    cache = Fp8Cache(model.config, max_cache_len=16, k_descale=_scale(3, KV_HEADS), v_descale=_scale(3, KV_HEADS))
    with pytest.raises(ValueError) as info:
        _generate(model, *_prompt(), cache=cache)
    _one_line(info, "k_descale", "(batch, kv_heads) = (2, 2)", "(3, 2)")
    assert cache.get_seq_length() == 0 and cache.layers[0]._k is None


def test_cache_for_another_attention_implementation_is_refused():
    """SDPA (or eager) cannot read fp8 tensors with descales: refused at the first forward."""
    model = _tiny_llama()
    model.set_attn_implementation("sdpa")
    with pytest.raises(ValueError) as info:
        _generate(model, *_prompt(), cache=Fp8Cache(model.config, max_cache_len=16))
    _one_line(info, "Fp8Cache", "'sdpa'", "register()")


def test_a_full_cache_is_refused():
    model = _tiny_llama()
    cache = Fp8Cache(model.config, max_cache_len=11)
    with pytest.raises(ValueError) as info:
        _generate(model, *_prompt(), cache=cache, new=4)  # 9 prompt tokens + 3 one-token steps > 11
    _one_line(info, "Fp8Cache is full", "11 cached + 1 new", "max_cache_len=11")
    assert cache.get_seq_length() == 11


def test_fp8_key_value_without_descales_are_refused():
    model = _tiny_llama()
    q = torch.randn(1, 4, 1, HEAD_DIM).bfloat16()
    kv = torch.zeros(1, KV_HEADS, 5, HEAD_DIM).to(torch.float8_e4m3fn)
    with pytest.raises(TypeError) as info:
        rf_hf.rocmflash_attention_forward(model.model.layers[0].self_attn, q, kv, kv, None,
                                          scaling=1 / math.sqrt(HEAD_DIM))
    _one_line(info, "without descales", "Fp8Cache")


def test_cpu_without_the_interpreter_is_refused(monkeypatch):
    model = _tiny_llama()
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError) as info:
        _generate(model, *_prompt(), cache=Fp8Cache(model.config, max_cache_len=16))
    _one_line(info, "Fp8Cache", "GPU", "TRITON_INTERPRET=1", "cpu")
