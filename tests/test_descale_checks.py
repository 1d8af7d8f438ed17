"""One descale check for the fp8 forward and the fp8 KV cache (``rocmflash.api.fp8.check_descale``) and one
value rule: a descale is refused exactly where the call could not give the dequantised answer. Triton's
interpreter (CPU).

* fp8 forward (``q/k/v_descale``): finite. Zero and negative descales are exact (checked against fp64
  attention of the dequantised inputs); NaN and +-inf raise (the kernel's error word; on the CPU the
  call itself raises).
* fp8 KV cache (``k/v_descale`` of ``flash_attn_with_kvcache``): finite and > 0 (the append stores
  ``k / k_descale``). A bad value writes nothing to the cache: the default call reports it through the
  decode error word (``check_errors``), ``check_values=True`` raises before anything runs.
* Missing, not a tensor, wrong dtype, wrong shape, wrong device: the same one-line error on both paths
  (the same text, from the same helper), and nothing written to the cache.
"""

import math

import pytest
import torch

import rocmflash

E4M3 = torch.float8_e4m3fn
B, HQ, HKV, D = 2, 4, 2, 32
pytestmark = [pytest.mark.usefixtures("interpret"), pytest.mark.filterwarnings("ignore::DeprecationWarning")]


@pytest.fixture(autouse=True)
def _fresh():
    """No error bits or kept decode plans from another test."""
    from rocmflash.api import decode as Dm
    from rocmflash.kernels.fp8 import errors as fp8_errors
    from rocmflash.kernels.decode import host as KD
    from rocmflash.kernels.decode import checks as DC

    for words in (DC._ERROR_WORDS, fp8_errors._ERROR_WORDS):
        words.clear()
    Dm.clear_cache()
    yield
    for words in (DC._ERROR_WORDS, fp8_errors._ERROR_WORDS):
        words.clear()
    Dm.clear_cache()


# ----------------------------------------------------------------------------- the two paths
def _forward_args(seed=0, Sq=9, Sk=11):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, h, s, D, generator=gen).mul(4).to(E4M3) for h, s in ((HQ, Sq), (HKV, Sk), (HKV, Sk)))
    qd, kd, vd = (torch.empty(B, HKV).uniform_(0.5, 1.5, generator=gen) for _ in range(3))
    return dict(q=q, k=k, v=v, q_descale=qd, k_descale=kd, v_descale=vd)


def _forward(args, causal=False):
    return rocmflash.attention(args["q"], args["k"], args["v"], causal=causal, q_descale=args["q_descale"],
                               k_descale=args["k_descale"], v_descale=args["v_descale"])


def _reference(args, causal):
    """fp64 attention of the dequantised inputs (``x_fp8 * descale[b, kv_head]``), ``(B, Hq, Sq, D)``."""
    group = HQ // HKV
    q, k, v = args["q"], args["k"], args["v"]
    qf = q.double() * args["q_descale"].double().repeat_interleave(group, 1)[:, :, None, None]
    kf, vf = ((x.double() * args[n].double()[:, :, None, None]).repeat_interleave(group, 1)
              for x, n in ((k, "k_descale"), (v, "v_descale")))
    s = (qf @ kf.transpose(-1, -2)) / math.sqrt(D)
    if causal:
        Sq, Sk = q.shape[2], k.shape[2]
        s = s.masked_fill(torch.arange(Sk)[None, :] > torch.arange(Sq)[:, None] + (Sk - Sq), float("-inf"))
    return torch.softmax(s, -1) @ vf, vf


def _cache_args(capacity=32):
    """An fp8 cache of zero bytes, one new token per sequence to append; descales 0.01 / 0.02."""
    gen = torch.Generator().manual_seed(1)
    kc, vc = (torch.zeros(B, capacity, HKV, D, dtype=torch.uint8).view(E4M3) for _ in range(2))
    return dict(q=torch.randn(B, 1, HQ, D, generator=gen).bfloat16(), k_cache=kc, v_cache=vc,
                k=torch.randn(B, 1, HKV, D, generator=gen).bfloat16(),
                v=torch.randn(B, 1, HKV, D, generator=gen).bfloat16(),
                cache_seqlens=torch.tensor([3, 10], dtype=torch.int32),
                k_descale=torch.full((B, HKV), 0.01), v_descale=torch.full((B, HKV), 0.02))


def _cache_bytes(args):
    return [args[n].view(torch.uint8).clone() for n in ("k_cache", "v_cache")]


def _assert_cache_unchanged(args, before):
    for name, b in zip(("k_cache", "v_cache"), before):
        assert torch.equal(args[name].view(torch.uint8), b), f"{name} was written"


# ----------------------------------------------------------------------------- values: forward
@pytest.mark.parametrize("which", ["q_descale", "k_descale", "v_descale"])
@pytest.mark.parametrize("value", [0.0, -0.75], ids=["zero", "negative"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_forward_zero_and_negative_descales_are_exact(which, value, causal):
    """A zero q/k descale gives that head uniform weights, a zero v descale a zero output, a negative one flips
    the scores or the output: the kernel's answer is the dequantised inputs' attention, and nothing is reported."""
    from rocmflash.api import fp8

    args = _forward_args(seed=3)
    args[which][1, 0] = value
    out = _forward(args, causal)
    ref, vf = _reference(args, causal)
    err = (out.double() - ref).abs()
    # the fp8 forward's bound (kernels/fp8/forward.py): P rounded to e4m3 (u = 2**-4) times max|V|, the bf16 cast
    assert (err <= 2.0 ** -4 * vf.abs().amax((-1, -2), keepdim=True) + 2.0 ** -8 * ref.abs() + 1e-6).all()
    head = out[1, 0:HQ // HKV].double()  # the query heads of kv head 0 of sequence 1
    if which == "v_descale" and value == 0.0:
        assert (head == 0).all()
    if which != "v_descale" and value == 0.0 and not causal:  # uniform weights: every row is V's mean
        mean = vf[1, 0].mean(0)
        assert ((head - mean).abs() <= 2.0 ** -4 * vf[1, 0].abs().max() + 2.0 ** -8 * mean.abs()).all()
    fp8.check_errors()  # nothing was reported


@pytest.mark.parametrize("which", ["q_descale", "k_descale", "v_descale"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")], ids=["nan", "inf", "-inf"])
def test_forward_non_finite_descales_raise(which, value):
    from rocmflash.api import fp8

    args = _forward_args()
    args[which][0, 1] = value
    with pytest.raises(ValueError, match=r"fp8 attention on cpu: this call got a non-finite q_descale \* k_descale "
                                         r"\* softmax_scale or v_descale") as info:
        _forward(args)
    assert "\n" not in str(info.value)
    fp8.check_errors()  # reported once, then reset


# ----------------------------------------------------------------------------- values: cache
CACHE_BAD = [0.0, -0.5, float("nan"), float("inf"), -float("inf")]
CACHE_IDS = ["zero", "negative", "nan", "inf", "-inf"]


@pytest.mark.parametrize("which", ["k_descale", "v_descale"])
@pytest.mark.parametrize("value", CACHE_BAD, ids=CACHE_IDS)
def test_cache_bad_descale_writes_nothing_and_is_reported(which, value):
    """Default path: the call returns (no host read), the cache's bytes are untouched, check_errors() names it."""
    from rocmflash import flash_attn_with_kvcache
    from rocmflash.api.decode import check_errors

    args = _cache_args()
    args[which][1, 0] = value
    before = _cache_bytes(args)
    flash_attn_with_kvcache(**args)
    _assert_cache_unchanged(args, before)
    with pytest.raises(ValueError, match="a call since the last check got a k_descale/v_descale not finite and > 0 "
                                         r"\(that call appended nothing\)"):
        check_errors()
    check_errors()  # reported once


@pytest.mark.parametrize("which", ["k_descale", "v_descale"])
@pytest.mark.parametrize("value", CACHE_BAD, ids=CACHE_IDS)
def test_cache_bad_descale_with_check_values_raises_before_writing(which, value):
    from rocmflash import flash_attn_with_kvcache
    from rocmflash.kernels import launch

    args = _cache_args()
    args[which][1, 0] = value
    before = _cache_bytes(args)
    with launch.observe_launches() as seen, pytest.raises(ValueError) as info:
        flash_attn_with_kvcache(**args, check_values=True)
    msg = str(info.value)
    assert f"{which}[1, 0] = {value}" in msg and "finite and > 0" in msg and "\n" not in msg, msg
    assert seen == []
    _assert_cache_unchanged(args, before)


def test_cache_good_descales_append():
    """The control: the same call with good descales does write the new rows (so 'unchanged' above means something)."""
    from rocmflash import flash_attn_with_kvcache

    args = _cache_args()
    before = _cache_bytes(args)
    flash_attn_with_kvcache(**args)
    assert not torch.equal(args["k_cache"].view(torch.uint8), before[0])
    assert not torch.equal(args["v_cache"].view(torch.uint8), before[1])


# ----------------------------------------------------------------------------- metadata: one check, one message
META_BAD = {
    "missing": (None, ValueError),
    "not a tensor": (0.01, TypeError),
    "float64": (torch.full((B, HKV), 0.01, dtype=torch.float64), TypeError),
    "float16": (torch.full((B, HKV), 0.01, dtype=torch.float16), TypeError),
    "1-D": (torch.full((B,), 0.01), ValueError),
    "transposed": (torch.full((HKV + 1, B), 0.01), ValueError),
    "3-D": (torch.full((B, HKV, 1), 0.01), ValueError),
    "meta device": (torch.full((B, HKV), 0.01, device="meta"), ValueError),
}


def _forward_error(which, bad):
    args = _forward_args()
    args[which] = bad
    with pytest.raises((TypeError, ValueError)) as info:
        _forward(args)
    return info.type, str(info.value)


def _cache_error(which, bad):
    from rocmflash import flash_attn_with_kvcache

    args = _cache_args()
    args[which] = bad
    before = _cache_bytes(args)
    with pytest.raises((TypeError, ValueError)) as info:
        flash_attn_with_kvcache(**args)
    _assert_cache_unchanged(args, before)
    return info.type, str(info.value)


@pytest.mark.parametrize("which", ["k_descale", "v_descale"])
@pytest.mark.parametrize("case", list(META_BAD))
def test_bad_descale_metadata_is_one_error_on_both_paths(which, case):
    """The forward and the cache refuse the same bad descale with the same exception and, but for what it is
    required with, the same words; the cache is never written."""
    bad, exc = META_BAD[case]
    fwd, cache = _forward_error(which, bad), _cache_error(which, bad)
    assert fwd[0] is exc and cache[0] is exc, (fwd, cache)
    assert fwd[1].startswith(which) and "\n" not in fwd[1] + cache[1]
    if case == "missing":
        assert fwd[1] == (f"{which} is required with fp8 inputs: an fp32 tensor of shape (batch, kv_heads) = "
                          f"({B}, {HKV}) (torch.ones for unscaled inputs)")
        assert cache[1] == fwd[1].replace("fp8 inputs", "an fp8 cache (it holds k / k_descale)")
    else:
        assert fwd[1] == cache[1]


def test_q_descale_metadata_is_checked_by_the_same_helper():
    """q_descale (forward only) goes through the same check: the shape error names (batch, kv_heads)."""
    with pytest.raises(ValueError, match=rf"q_descale must have shape \(batch, kv_heads\) = \({B}, {HKV}\), "
                                         rf"got \({B}, {HQ}\)"):
        _forward(dict(_forward_args(), q_descale=torch.ones(B, HQ)))
