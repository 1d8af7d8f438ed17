"""``flash_attn_with_kvcache(..., cache_leftpad=...)``: left-padded caches, in Triton's interpreter (CPU).

Sequence ``b`` is keys ``[cache_leftpad[b], cache_seqlens[b] + Sk_new)`` of its cache; causal masks
and windows stay aligned to the end. The keys before the start hold NaN, so a kernel that reads
(not only attends) one of them fails; the reference is fp64 attention over the sequence's own keys.
Also: start = end (a sequence with no key: output 0, LSE -inf), pages wholly before the start may
be invalid, and bad starts raise before anything is written.
"""

import math

import pytest
import torch

from test_kvcache_interp import TOL, _args, cache_rows, fill, make_cache
from varlen_reference import attention_fp64, rel_err


def run_leftpad(lengths, pads, Sq, group, D, dtype, page, causal=True, window=(-1, -1), num_splits=0, seed=0,
                Hkv=2, capacity=96, append=True):
    from rocmflash import flash_attn_with_kvcache

    gen = torch.Generator().manual_seed(seed)
    B = len(lengths)
    new = Sq if append else 0
    kc, vc, table = make_cache(B, Hkv, D, capacity, page, dtype, gen)
    for b, (n, pad) in enumerate(zip(lengths, pads)):
        assert 0 <= pad <= n + new
        fill(kc, table, b, n, page, gen)
        fill(vc, table, b, n, page, gen)
        if table is None:  # the padding before the start: NaN (never read)
            kc[b, :pad] = float("nan")
            vc[b, :pad] = float("nan")
        else:
            idx = torch.arange(pad)
            kc[table[b][idx // page].long(), idx % page] = float("nan")
            vc[table[b][idx // page].long(), idx % page] = float("nan")
    q = torch.randn(B, Sq, Hkv * group, D, generator=gen).to(dtype)
    k_new = torch.randn(B, Sq, Hkv, D, generator=gen).to(dtype) if append else None
    v_new = torch.randn(B, Sq, Hkv, D, generator=gen).to(dtype) if append else None
    lens = torch.tensor(lengths, dtype=torch.int32)
    starts = torch.tensor(pads, dtype=torch.int32)
    out, lse = flash_attn_with_kvcache(q, kc, vc, k_new, v_new, cache_seqlens=lens, block_table=table,
                                       causal=causal, window_size=window, num_splits=num_splits, return_lse=True,
                                       cache_leftpad=starts)
    assert torch.isfinite(out).all()
    for b, (n, pad) in enumerate(zip(lengths, pads)):
        keys = cache_rows(kc, table, b, n + new, page)[pad:]
        vals = cache_rows(vc, table, b, n + new, page)[pad:]
        ref, ref_lse = attention_fp64(q[b], keys, vals, 1 / math.sqrt(D), causal, window)
        assert rel_err(out[b], ref) < TOL[dtype], b
        seen = torch.isfinite(ref_lse)
        assert torch.equal(torch.isfinite(lse[b]), seen), b
        assert (out[b].transpose(0, 1)[~seen] == 0).all()
        if seen.any():
            assert (lse[b][seen].double() - ref_lse[seen]).abs().max().item() < 1e-3
    return out


@pytest.mark.parametrize("page", [0, 16, 64])
@pytest.mark.parametrize("group", [1, 4])
def test_leftpad_one_token(interpret, page, group):
    """Starts inside the first key block, on a block edge, past several blocks, and at the very end."""
    run_leftpad([0, 1, 57, 90], [1, 0, 16, 91], 1, group, 64, torch.bfloat16, page, num_splits=3,
                seed=page + group)


@pytest.mark.parametrize("causal", [False, True])
def test_leftpad_several_tokens_and_window(interpret, causal):
    """Sq=3 new tokens aligned to the end (causal), with a left window crossing the start."""
    run_leftpad([30, 70], [5, 41], 3, 4, 80, torch.float16, 16, causal=causal, window=(12, -1), seed=5 + causal)


@pytest.mark.parametrize("num_splits", [1, 2, 7])
def test_leftpad_split_counts(interpret, num_splits):
    """One split (the split kernel writes the output) and several (the combine merges), same result."""
    outs = [run_leftpad([90, 40], [33, 3], 1, 8, 128, torch.bfloat16, 0, num_splits=n, seed=9)
            for n in (num_splits, 0)]
    assert rel_err(outs[0], outs[1]) < 1e-2


def test_leftpad_zero_is_no_padding(interpret):
    """All starts 0: the same output as a call without ``cache_leftpad``."""
    from rocmflash import flash_attn_with_kvcache

    gen = torch.Generator().manual_seed(4)
    kc = torch.randn(2, 64, 2, 64, generator=gen).to(torch.bfloat16)
    vc = torch.randn(2, 64, 2, 64, generator=gen).to(torch.bfloat16)
    q = torch.randn(2, 1, 4, 64, generator=gen).to(torch.bfloat16)
    lens = torch.tensor([50, 64], dtype=torch.int32)
    plain = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, num_splits=2)
    padded = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, num_splits=2,
                                     cache_leftpad=torch.zeros(2, dtype=torch.int32))
    assert torch.equal(plain, padded)


def test_leftpad_pages_before_the_start_are_not_checked_or_read(interpret):
    """Paged: table entries of pages wholly before a sequence's start may point anywhere."""
    from rocmflash import flash_attn_with_kvcache

    gen = torch.Generator().manual_seed(6)
    kc, vc, table = make_cache(2, 2, 32, 64, 16, torch.float16, gen)
    for b in range(2):
        fill(kc, table, b, 64, 16, gen)
        fill(vc, table, b, 64, 16, gen)
    q = torch.randn(2, 1, 4, 32, generator=gen).to(torch.float16)
    lens = torch.tensor([40, 60], dtype=torch.int32)
    starts = torch.tensor([33, 20], dtype=torch.int32)
    want = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table, cache_leftpad=starts)
    bad = table.clone()
    bad[0, :2] = 10 ** 6  # keys 0..31 of sequence 0: before its start 33
    bad[1, 0] = -1  # keys 0..15 of sequence 1: before its start 20
    got = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=bad, cache_leftpad=starts)
    assert torch.equal(want, got)


@pytest.mark.parametrize("starts,exc,words", [
    (torch.tensor([3, 12], dtype=torch.int32), ValueError, "cache_leftpad[1]=12 must be in 0..11"),
    (torch.tensor([-1, 0], dtype=torch.int32), ValueError, "cache_leftpad[0]"),
    (torch.tensor([0, 0, 0], dtype=torch.int32), ValueError, "cache_leftpad must be (B=2,)"),
    (torch.tensor([0.0, 1.0]), TypeError, "cache_leftpad"),
    (torch.tensor([[0, 1]], dtype=torch.int32), ValueError, "cache_leftpad must be 1-D"),
])
def test_leftpad_bad_input_raises_before_writing(interpret, starts, exc, words):
    from rocmflash import flash_attn_with_kvcache

    args = _args()  # B=2, cache_seqlens [3, 10], one new key each, pages of 16
    kc, vc = args["k_cache"], args["v_cache"]
    before = kc.clone(), vc.clone()
    with pytest.raises(exc) as info:  # values checked on the host: check_values=True (the default checks on the GPU)
        flash_attn_with_kvcache(**args, cache_leftpad=starts, check_values=True)
    assert words in str(info.value)
    assert torch.equal(kc, before[0]) and torch.equal(vc, before[1])
