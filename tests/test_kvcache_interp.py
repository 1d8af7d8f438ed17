"""``flash_attn_with_kvcache`` against an fp64 reference, in Triton's interpreter (CPU).

Contiguous and paged caches (page sizes 1, 16 and 64, shuffled block tables), per-sequence
lengths including 0 and 1, GQA 1/4/8, one and several new tokens, causal both, a sliding
window, soft-capping, explicit and automatic split counts, appends (exactly the new rows
written), LSE; and every bad input raising before anything is written to the cache.
Unused cache slots hold NaN: a kernel that reads past a sequence's end fails the test.
"""

import math

import pytest
import torch

from varlen_reference import attention_fp64, rel_err

TOL = {torch.float16: 1e-2, torch.bfloat16: 2.5e-2}


def make_cache(B, Hkv, D, capacity, page, dtype, gen):
    """(k_cache, v_cache, block_table or None): contiguous when page == 0, else shuffled pages; NaN-filled."""
    if page:
        pages = -(-capacity // page)
        num_blocks = B * pages + 2
        k = torch.full((num_blocks, page, Hkv, D), float("nan")).to(dtype)
        table = torch.randperm(num_blocks, generator=gen)[:B * pages].view(B, pages).to(torch.int32)
    else:
        k = torch.full((B, capacity, Hkv, D), float("nan")).to(dtype)
        table = None
    return k, k.clone(), table


def cache_rows(cache, table, b, n, page):
    """The first n keys of sequence b, in order."""
    if table is None:
        return cache[b, :n]
    idx = torch.arange(n)
    return cache[table[b][idx // page].long(), idx % page]


def fill(cache, table, b, n, page, gen):
    """Random keys at positions [0, n) of sequence b."""
    vals = torch.randn(n, *cache.shape[2:], generator=gen).to(cache.dtype)
    if table is None:
        cache[b, :n] = vals
    else:
        idx = torch.arange(n)
        cache[table[b][idx // page].long(), idx % page] = vals


def run_case(lengths, Sq, group, D, dtype, page, causal=True, window=(-1, -1), softcap=0.0, num_splits=0,
             append=True, seed=0, Hkv=2, capacity=96):
    from rocmflash import flash_attn_with_kvcache

    gen = torch.Generator().manual_seed(seed)
    B = len(lengths)
    kc, vc, table = make_cache(B, Hkv, D, capacity, page, dtype, gen)
    for b, n in enumerate(lengths):
        fill(kc, table, b, n, page, gen)
        fill(vc, table, b, n, page, gen)
    q = torch.randn(B, Sq, Hkv * group, D, generator=gen).to(dtype)
    k_new = torch.randn(B, Sq, Hkv, D, generator=gen).to(dtype) if append else None
    v_new = torch.randn(B, Sq, Hkv, D, generator=gen).to(dtype) if append else None
    before_k = kc.clone()
    lens = torch.tensor(lengths, dtype=torch.int32)
    out, lse = flash_attn_with_kvcache(q, kc, vc, k_new, v_new, cache_seqlens=lens, block_table=table,
                                       causal=causal, window_size=window, softcap=softcap, num_splits=num_splits,
                                       return_lse=True)
    assert out.shape == q.shape and lse.shape == (B, Hkv * group, Sq)
    assert torch.isfinite(out).all()
    new = Sq if append else 0
    for b, n in enumerate(lengths):
        keys = cache_rows(kc, table, b, n + new, page)
        vals = cache_rows(vc, table, b, n + new, page)
        if append:
            assert torch.equal(keys[n:], k_new[b]) and torch.equal(vals[n:], v_new[b])
        assert torch.equal(keys[:n], cache_rows(before_k, table, b, n, page))
        ref, ref_lse = attention_fp64(q[b], keys, vals, 1 / math.sqrt(D), causal, window, softcap)
        assert rel_err(out[b], ref) < TOL[dtype], b
        seen = torch.isfinite(ref_lse)
        assert torch.equal(torch.isfinite(lse[b]), seen)
        if seen.any():
            assert (lse[b][seen].double() - ref_lse[seen]).abs().max().item() < 1e-3
    # nothing outside the appended rows changed (NaN-aware)
    changed = ~((kc == before_k) | (kc.isnan() & before_k.isnan()))
    assert int(changed.any(-1).any(-1).sum()) <= B * new


@pytest.mark.parametrize("page", [0, 1, 16, 64])
@pytest.mark.parametrize("group", [1, 4, 8])
def test_decode_one_token(interpret, page, group):
    run_case([0, 1, 57, 90], 1, group, 64, torch.bfloat16, page, seed=page + group, num_splits=3)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("page", [0, 16])
def test_decode_several_tokens(interpret, causal, page):
    run_case([5, 33, 80], 4, 4, 80, torch.float16, page, causal=causal, seed=7 + causal)


def test_decode_window_and_softcap(interpret):
    run_case([40, 90], 2, 2, 64, torch.bfloat16, 16, causal=True, window=(20, -1), softcap=8.0, num_splits=2,
             seed=3)


@pytest.mark.parametrize("num_splits", [0, 1, 5])
def test_decode_split_counts_agree(interpret, num_splits):
    run_case([90, 17], 1, 8, 128, torch.bfloat16, 0, num_splits=num_splits, seed=11)


def test_decode_without_append_and_full_cache(interpret):
    """No new keys; cache_seqlens=None on a contiguous cache uses every slot."""
    from rocmflash import flash_attn_with_kvcache

    gen = torch.Generator().manual_seed(5)
    q = torch.randn(2, 1, 4, 32, generator=gen).to(torch.float16)
    kc = torch.randn(2, 50, 2, 32, generator=gen).to(torch.float16)
    vc = torch.randn(2, 50, 2, 32, generator=gen).to(torch.float16)
    out = flash_attn_with_kvcache(q, kc, vc, num_splits=4)
    for b in range(2):
        ref, _ = attention_fp64(q[b], kc[b], vc[b], 1 / math.sqrt(32))
        assert rel_err(out[b], ref) < 1e-2
    run_case([12, 60], 1, 2, 32, torch.float16, 16, append=False, seed=6)


# ----------------------------------------------------------------------------- bad input
def _args(page=16):
    gen = torch.Generator().manual_seed(1)
    kc, vc, table = make_cache(2, 2, 32, 64, page, torch.float16, gen)
    kc.zero_()
    vc.zero_()
    return dict(q=torch.randn(2, 1, 4, 32).to(torch.float16), k_cache=kc, v_cache=vc,
                k=torch.randn(2, 1, 2, 32).to(torch.float16), v=torch.randn(2, 1, 2, 32).to(torch.float16),
                cache_seqlens=torch.tensor([3, 10], dtype=torch.int32), block_table=table)


@pytest.mark.parametrize("change,exc,words", [
    (dict(cache_seqlens=torch.tensor([3, 64], dtype=torch.int32)), ValueError, "cache_seqlens[1]"),
    (dict(cache_seqlens=torch.tensor([-1, 3], dtype=torch.int32)), ValueError, "cache_seqlens[0]"),
    (dict(cache_seqlens=torch.tensor([3.0, 1.0])), TypeError, "cache_seqlens"),
    (dict(cache_seqlens=torch.tensor([3], dtype=torch.int32)), ValueError, "cache_seqlens"),
    (dict(cache_seqlens=None), ValueError, "cache_seqlens"),
    (dict(block_table=torch.tensor([[99, 1, 2, 3], [4, 5, 6, 7]], dtype=torch.int32)), ValueError, "block_table[0]"),
    (dict(block_table=torch.zeros(2, 4, dtype=torch.int64)), TypeError, "block_table"),
    (dict(block_table=torch.zeros(3, 4, dtype=torch.int32)), ValueError, "block_table"),
    (dict(window_size=(-3, 0)), ValueError, "window_size"),
    (dict(softcap=-0.5), ValueError, "softcap"),
    (dict(softmax_scale=float("inf")), ValueError, "softmax_scale"),
    (dict(num_splits=-1), ValueError, "num_splits"),
    (dict(v=None), ValueError, "k and v"),
    (dict(k=torch.randn(2, 1, 3, 32).to(torch.float16), v=torch.randn(2, 1, 3, 32).to(torch.float16)), ValueError, "k must be"),
    (dict(q=torch.randn(2, 1, 3, 32).to(torch.float16)), ValueError, "multiple of key/value heads"),
    (dict(q=torch.randn(2, 1, 4, 32)), TypeError, "q.dtype"),
    (dict(q=torch.randn(2, 4, 32).to(torch.float16)), ValueError, "4-D"),
])
def test_decode_bad_input_raises_before_writing(interpret, change, exc, words):
    from rocmflash import flash_attn_with_kvcache

    args = _args()
    args.update(change)
    before = args["k_cache"].clone(), args["v_cache"].clone()
    with pytest.raises(exc) as info:
        flash_attn_with_kvcache(**args)
    assert words in str(info.value)
    assert torch.equal(args["k_cache"], before[0]) and torch.equal(args["v_cache"], before[1])


def test_decode_contiguous_cache_overflow(interpret):
    from rocmflash import flash_attn_with_kvcache

    args = _args(page=0)
    args["cache_seqlens"] = 64  # full: no room for the new key
    with pytest.raises(ValueError, match="does not fit"):
        flash_attn_with_kvcache(**args)
