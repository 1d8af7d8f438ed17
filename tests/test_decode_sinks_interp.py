"""Attention sinks (``s_aux``) in ``flash_attn_with_kvcache`` and the dense decode entry, in Triton's interpreter.

A sink is one logit per query head joined to each row's softmax denominator (gpt-oss; transformers' eager
``softmax(cat([q k^T * scaling, sink]))`` with the sink's column dropped). The reference below is that formula in
fp64, written out here (not the kernel's online softmax). Cases: contiguous and paged caches, GQA (a distinct sink
per query head), one split and several (the sink must join exactly once: split 0, then the combine), the fused
merge, ragged lengths with new k/v appended, rows that see no key (output 0, LSE = the sink), several tokens with
a window and soft-capping (the sink is not capped), an fp8 cache, bf16 and strided sinks, LSE holding the sink,
``-inf`` = no sink (bit for bit), kept plans never serving a call of the other kind, NaN/+inf sinks reported,
and bad sinks raising one-line errors before anything is written. Unused cache slots hold NaN.
"""

import math

import pytest
import torch

from test_fp8_kvcache import _cache as fp8_cache, _fill as fp8_fill, _quantise, _rows as fp8_rows, _scales
from test_kvcache_interp import cache_rows, fill, make_cache
from varlen_reference import band_mask, rel_err

TOL = {torch.float16: 1e-2, torch.bfloat16: 2.5e-2}


pytestmark = pytest.mark.usefixtures("fresh_decode")  # no error bits or kept plans from another test


def sink_attention_fp64(q, k, v, sinks, scale, causal=False, window=(-1, -1), softcap=0.0):
    """One sequence, gpt-oss's eager formula in fp64: q ``(Sq, Hq, D)``, k/v ``(Sk, Hkv, D)``, sinks ``(Hq,)`` ->
    out ``(Sq, Hq, D)``, lse ``(Hq, Sq)`` of keys and sink together (natural log)."""
    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = torch.einsum("qhd,khd->hqk", q, k) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(~band_mask(q.shape[0], k.shape[0], causal, window).to(s.device), float("-inf"))
    sink_col = sinks.double()[:, None, None].expand(-1, q.shape[0], 1)
    combined = torch.cat([s, sink_col], -1)  # (Hq, Sq, Sk + 1)
    lse = torch.logsumexp(combined, -1)
    probs = torch.softmax(combined, -1)[..., :-1]  # the sink's column dropped
    return torch.einsum("hqk,khd->qhd", probs, v), lse


def make_sinks(Hq, gen, dtype=torch.float32, strided=False):
    """Per-head sinks around the scores' size (so they matter), every head its own; ``strided``: every other
    element of a longer tensor."""
    x = torch.randn(Hq * (2 if strided else 1), generator=gen) * 1.5 + 0.5
    x = x[::2] if strided else x
    return x.to(dtype)


def run_sinks(lengths, Sq, group, D, dtype, page, *, causal=True, window=(-1, -1), softcap=0.0, num_splits=0,
              append=True, seed=0, Hkv=2, capacity=80, sinks=None, sink_dtype=torch.float32, strided=False,
              check_values=False):
    """One call with sinks against :func:`sink_attention_fp64`; returns ``(out, lse, sinks)``."""
    from rocmflash import flash_attn_with_kvcache
    from rocmflash.api.decode import check_errors

    gen = torch.Generator().manual_seed(seed)
    B, Hq = len(lengths), Hkv * group
    kc, vc, table = make_cache(B, Hkv, D, capacity, page, dtype, gen)
    for b, n in enumerate(lengths):
        fill(kc, table, b, n, page, gen)
        fill(vc, table, b, n, page, gen)
    q = torch.randn(B, Sq, Hq, D, generator=gen).to(dtype)
    k_new = torch.randn(B, Sq, Hkv, D, generator=gen).to(dtype) if append else None
    v_new = torch.randn(B, Sq, Hkv, D, generator=gen).to(dtype) if append else None
    if sinks is None:
        sinks = make_sinks(Hq, gen, sink_dtype, strided)
    lens = torch.tensor(lengths, dtype=torch.int32)
    out, lse = flash_attn_with_kvcache(q, kc, vc, k_new, v_new, cache_seqlens=lens, block_table=table, causal=causal,
                                       window_size=window, softcap=softcap, num_splits=num_splits,
                                       return_softmax_lse=True, s_aux=sinks, check_values=check_values)
    check_errors()  # nothing out of range
    new = Sq if append else 0
    for b, n in enumerate(lengths):
        keys, vals = cache_rows(kc, table, b, n + new, page), cache_rows(vc, table, b, n + new, page)
        if append:
            assert torch.equal(keys[n:], k_new[b]) and torch.equal(vals[n:], v_new[b])
        ref, ref_lse = sink_attention_fp64(q[b], keys, vals, sinks, 1 / math.sqrt(D), causal, window, softcap)
        assert rel_err(out[b], ref) < TOL[dtype], (b, rel_err(out[b], ref))
        assert (lse[b].double() - ref_lse).abs().max().item() < 1e-3, b  # every row: the sink is always seen
    return out, lse, sinks


@pytest.mark.parametrize("page", [0, 16])
@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("splits", [1, 3])
def test_sinks_one_token_contiguous_and_paged(interpret, page, group, splits):
    """Ragged lengths (0 .. 70) plus one appended token, GQA, one split (the kernel writes the output) and three
    (partials and the combine: the sink must join once)."""
    run_sinks([0, 1, 37, 70], 1, group, 32, torch.bfloat16, page, num_splits=splits, seed=10 * page + group + splits)


def test_sinks_without_append_and_rows_that_see_no_key(interpret):
    """Nothing appended, a sequence of length 0: its rows see only the sink -> output exactly 0, LSE = the sink."""
    out, lse, sinks = run_sinks([0, 5, 60], 1, 4, 32, torch.float16, 0, append=False, num_splits=3, seed=5)
    assert (out[0] == 0).all()
    assert torch.allclose(lse[0, :, 0].double(), sinks.double(), atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_sinks_several_tokens(interpret, causal):
    run_sinks([3, 30, 66], 3, 2, 32, torch.float16, 16, causal=causal, num_splits=2, seed=20 + causal)


def test_sinks_with_window_and_softcap(interpret):
    """A sliding window and soft-capping: the sink joins as it is (never capped), the window masks only keys."""
    run_sinks([40, 70], 2, 2, 32, torch.bfloat16, 16, window=(12, -1), softcap=4.0, num_splits=3, seed=31)


def test_sinks_bf16_and_strided(interpret):
    """Sinks in bf16 (gpt-oss's parameter dtype) and a strided (Hq,) view: read as they are, no copy."""
    run_sinks([9, 50], 1, 4, 32, torch.bfloat16, 0, num_splits=2, sink_dtype=torch.bfloat16, seed=41)
    run_sinks([9, 50], 1, 4, 32, torch.bfloat16, 16, num_splits=1, strided=True, seed=42)


def test_sinks_with_host_value_checks(interpret):
    """``check_values=True`` (host checks first) with good sinks runs the same kernel."""
    run_sinks([7, 44], 1, 2, 32, torch.float16, 16, num_splits=2, check_values=True, seed=43)


def test_sinks_in_the_fused_merge(interpret, monkeypatch):
    """The one-launch path whose last split program merges (``FUSED_COMBINE``): split 0's sink counted once."""
    from rocmflash.api import decode
    from rocmflash.kernels.decode import host as KD
    from rocmflash.kernels.common import observe_launches

    monkeypatch.setattr(KD, "FUSED_COMBINE", True)
    monkeypatch.setattr(KD, "_ARRIVALS", {})
    decode.clear_cache()
    with observe_launches() as seen:
        run_sinks([0, 1, 37, 70], 1, 4, 32, torch.bfloat16, 16, num_splits=4, seed=51)
    assert [r["kernel"] for r in seen] == ["_append_rows", "_decode_split"]  # no combine launch


def test_minus_inf_sink_is_no_sink_bit_for_bit(interpret):
    """An all ``-inf`` sink gives exactly the no-sink call's output and LSE; one ``-inf`` head among finite ones
    is that head without a sink (the reference's -inf column adds nothing)."""
    from rocmflash import flash_attn_with_kvcache

    gen = torch.Generator().manual_seed(61)
    B, Hkv, group, D = 2, 2, 4, 32
    kc, vc, _ = make_cache(B, Hkv, D, 64, 0, torch.bfloat16, gen)
    for b in range(B):
        fill(kc, None, b, 64, 0, gen)
        fill(vc, None, b, 64, 0, gen)
    q = torch.randn(B, 1, Hkv * group, D, generator=gen).to(torch.bfloat16)
    for splits in (1, 3):
        plain = flash_attn_with_kvcache(q, kc, vc, num_splits=splits, return_softmax_lse=True)
        none = flash_attn_with_kvcache(q, kc, vc, num_splits=splits, return_softmax_lse=True,
                                       s_aux=torch.full((Hkv * group,), float("-inf")))
        assert torch.equal(plain[0], none[0]) and torch.equal(plain[1], none[1]), splits
    sinks = make_sinks(Hkv * group, gen)
    sinks[3] = float("-inf")
    out, lse = flash_attn_with_kvcache(q, kc, vc, num_splits=3, return_softmax_lse=True, s_aux=sinks)
    for b in range(B):
        ref, ref_lse = sink_attention_fp64(q[b], kc[b], vc[b], sinks, D ** -0.5)
        assert rel_err(out[b], ref) < TOL[torch.bfloat16]
        assert (lse[b].double() - ref_lse).abs().max().item() < 1e-3


def test_kept_plans_key_on_sinks(interpret):
    """A signature seen without sinks (its plan kept from the second call) never serves a call with them, nor the
    other way round; each call matches its own reference."""
    from rocmflash import flash_attn_with_kvcache
    from rocmflash.api import decode as Dm

    gen = torch.Generator().manual_seed(71)
    B, Hkv, group, D = 2, 2, 2, 32
    kc, vc, _ = make_cache(B, Hkv, D, 48, 0, torch.float16, gen)
    for b in range(B):
        fill(kc, None, b, 48, 0, gen)
        fill(vc, None, b, 48, 0, gen)
    q = torch.randn(B, 1, Hkv * group, D, generator=gen).to(torch.float16)
    sinks = make_sinks(Hkv * group, gen)
    for use in (None, None, sinks, sinks, None, sinks):  # each signature twice in a row: kept plans replayed
        out = flash_attn_with_kvcache(q, kc, vc, num_splits=2, s_aux=use)
        for b in range(B):
            if use is None:
                s = torch.einsum("qhd,khd->hqk", q[b].double(), kc[b].double().repeat_interleave(group, 1))
                ref = torch.einsum("hqk,khd->qhd", torch.softmax(s * D ** -0.5, -1),
                                   vc[b].double().repeat_interleave(group, 1))
            else:
                ref, _ = sink_attention_fp64(q[b], kc[b], vc[b], use, D ** -0.5)
            assert rel_err(out[b], ref) < TOL[torch.float16], (use is None, b)
    assert any(plan.call.sinks for plan in Dm._CALL_PLANS.values())
    assert any(not plan.call.sinks for plan in Dm._CALL_PLANS.values())


def test_dense_decode_entry_takes_sinks(interpret):
    """``attend_whole_cache`` (the decode kernel serving a dense decode-shaped call) with sinks, LSE included,
    through a kept owner plan: the owner's key does not know the sinks, so the plans must not mix."""
    from rocmflash.api.decode import attend_whole_cache

    gen = torch.Generator().manual_seed(81)
    B, Sq, Sk, Hkv, group, D = 2, 2, 70, 2, 4, 32
    q = torch.randn(B, Sq, Hkv * group, D, generator=gen).to(torch.bfloat16)
    k = torch.randn(B, Sk, Hkv, D, generator=gen).to(torch.bfloat16)
    v = torch.randn(B, Sk, Hkv, D, generator=gen).to(torch.bfloat16)
    sinks = make_sinks(Hkv * group, gen)
    owner = ("test-owner",)
    for use in (sinks, None, sinks, None, sinks):
        out = torch.full_like(q, float("nan"))
        lse = torch.full((B, Hkv * group, Sq), float("nan"))
        attend_whole_cache(q, k, v, D ** -0.5, True, out, lse, owner=owner, sinks=use)
        for b in range(B):
            sink_ref = use if use is not None else torch.full((Hkv * group,), float("-inf"))
            ref, ref_lse = sink_attention_fp64(q[b], k[b], v[b], sink_ref, D ** -0.5, causal=True)
            assert rel_err(out[b], ref) < TOL[torch.bfloat16], (use is None, b)
            assert (lse[b].double() - ref_lse).abs().max().item() < 1e-3


@pytest.mark.parametrize("splits", [1, 3])
def test_sinks_with_an_fp8_cache(interpret, splits):
    """An fp8 cache (scales folded into the scores): the sink joins in the same units, against the fp64 reference
    of the dequantised cache."""
    from rocmflash import flash_attn_with_kvcache
    from rocmflash.api.decode import check_errors

    dtype, page, Hkv, group, D = torch.float8_e4m3fn, 16, 2, 4, 32
    gen = torch.Generator().manual_seed(91 + splits)
    lengths = [0, 20, 61]
    B = len(lengths)
    kc, vc, table = fp8_cache(B, Hkv, D, 80, page, dtype, gen)
    ks, vs = _scales(B, Hkv, gen), _scales(B, Hkv, gen)
    for b, n in enumerate(lengths):
        for c, s in ((kc, ks), (vc, vs)):
            fp8_fill(c, table, b, n, page, _quantise(torch.randn(1, n, Hkv, D, generator=gen) / 100, s[b:b + 1],
                                                     dtype)[0])
    q = torch.randn(B, 1, Hkv * group, D, generator=gen).to(torch.bfloat16)
    k_new = (torch.randn(B, 1, Hkv, D, generator=gen) / 100).to(torch.bfloat16)
    v_new = (torch.randn(B, 1, Hkv, D, generator=gen) / 100).to(torch.bfloat16)
    sinks = make_sinks(Hkv * group, gen)
    lens = torch.tensor(lengths, dtype=torch.int32)
    out, lse = flash_attn_with_kvcache(q, kc, vc, k_new, v_new, cache_seqlens=lens, block_table=table, causal=True,
                                       num_splits=splits, return_softmax_lse=True, k_descale=ks, v_descale=vs,
                                       s_aux=sinks)
    check_errors()
    for b, n in enumerate(lengths):
        k_deq = fp8_rows(kc, table, b, n + 1, page).float() * ks[b][None, :, None]
        v_deq = fp8_rows(vc, table, b, n + 1, page).float() * vs[b][None, :, None]
        ref, ref_lse = sink_attention_fp64(q[b], k_deq, v_deq, sinks, D ** -0.5, causal=True)
        assert rel_err(out[b], ref) < TOL[torch.bfloat16], b
        assert (lse[b].double() - ref_lse).abs().max().item() < 1e-3, b


# ----------------------------------------------------------------------------- bad sinks
def _small(gen):
    B, Hkv, group, D = 2, 2, 2, 32
    kc, vc, _ = make_cache(B, Hkv, D, 32, 0, torch.float16, gen)
    for b in range(B):
        fill(kc, None, b, 20, 0, gen)
        fill(vc, None, b, 20, 0, gen)
    q = torch.randn(B, 1, Hkv * group, D, generator=gen).to(torch.float16)
    new = torch.randn(B, 1, Hkv, D, generator=gen).to(torch.float16)
    return q, kc, vc, new, torch.tensor([20, 20], dtype=torch.int32)


@pytest.mark.parametrize("bad,kind,words", [
    (torch.zeros(5), ValueError, ["s_aux", "shape (Hq=4,)", "(5,)"]),
    (torch.zeros(1, 4), ValueError, ["s_aux", "shape (Hq=4,)", "(1, 4)"]),
    (torch.zeros(4, dtype=torch.int32), ValueError, ["s_aux", "float32, bfloat16 or float16", "torch.int32"]),
    (torch.zeros(4, dtype=torch.float64), ValueError, ["s_aux", "float32, bfloat16 or float16", "torch.float64"]),
    (torch.zeros(4, device="meta"), ValueError, ["s_aux", "meta", "q is on cpu"]),
    ([0.0, 0.0, 0.0, 0.0], TypeError, ["s_aux", "torch.Tensor", "list"]),
])
def test_bad_sinks_raise_before_anything_is_written(interpret, bad, kind, words):
    from rocmflash import flash_attn_with_kvcache

    q, kc, vc, new, lens = _small(torch.Generator().manual_seed(101))
    before_k, before_v, before_lens = kc.clone(), vc.clone(), lens.clone()
    with pytest.raises(kind) as info:
        flash_attn_with_kvcache(q, kc, vc, new, new, cache_seqlens=lens, s_aux=bad)
    message = str(info.value)
    assert "\n" not in message and all(w in message for w in words), message
    assert torch.equal(kc.isnan(), before_k.isnan()) and torch.equal(kc.nan_to_num(), before_k.nan_to_num())
    assert torch.equal(vc.nan_to_num(), before_v.nan_to_num()) and torch.equal(lens, before_lens)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_nan_or_inf_sink_is_reported(interpret, value):
    """On the default path the kernel raises BAD_SINK in the error word (no host read): ``check_errors`` names
    ``s_aux``; with ``check_values=True`` the host check raises first, with the head and value, and writes nothing."""
    from rocmflash import flash_attn_with_kvcache
    from rocmflash.api.decode import check_errors

    q, kc, vc, new, lens = _small(torch.Generator().manual_seed(111))
    sinks = torch.zeros(4)
    sinks[2] = value
    out = flash_attn_with_kvcache(q, kc, vc, new, new, cache_seqlens=lens, s_aux=sinks)
    assert out[:, :, 2].isnan().all() and not out[:, :, [0, 1, 3]].isnan().any()  # only that head
    with pytest.raises(ValueError, match=r"s_aux \(attention sink\) NaN or \+inf"):
        check_errors()
    check_errors()  # reported once, then reset
    before = kc.nan_to_num()
    with pytest.raises(ValueError, match=r"s_aux\[2\] = (nan|inf): attention sinks must be finite or -inf"):
        flash_attn_with_kvcache(q, kc, vc, new, new, cache_seqlens=lens, s_aux=sinks, check_values=True)
    assert torch.equal(kc.nan_to_num(), before)


def test_sinks_build_cross_compiles_and_the_plain_build_has_no_sink_load():
    """The ``sinks`` build compiles for an AMD and an NVIDIA target; the plain build (SINKS off) reads no sink: its
    kernel never loads through the sink pointer (argument unused). On gfx942 (AMD's default, D=128) the sinks
    build spills nothing and keeps the plain build's waves/SIMD (VGPRs 150 -> 154 with Triton 3.6)."""
    from isa_tools import kernel_summary, read_code_object
    from rocmflash.kernels.decode import host as KD

    for target, key, head_dim in (("gfx942", "amdgcn", 128), ("sm_90", "ptx", 64)):
        cfg = KD.default_decode_config(target, head_dim)
        plain, with_sinks = (KD.compile_for(target, cfg, head_dim, "bf16", group=8, sinks=sinks)[0]
                             for sinks in (False, True))
        assert plain.asm[key] != with_sinks.asm[key]
        if key == "ptx":  # parameter 14 is SINK: the plain build never reads it, the sinks build does
            assert "_decode_split_param_14]" not in plain.asm[key] and "_decode_split_param_14]" in with_sinks.asm[key]
        else:
            plain_s, sinks_s = (kernel_summary(read_code_object(k.asm["hsaco"])[0], num_warps=k.metadata.num_warps,
                                               asm=k.asm["amdgcn"]) for k in (plain, with_sinks))
            assert sinks_s["vgpr_spill_count"] == 0 and sinks_s["scratch_bytes"] == 0, sinks_s
            assert sinks_s["waves_per_simd"] == plain_s["waves_per_simd"] >= 2, (plain_s, sinks_s)
