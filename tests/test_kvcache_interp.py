"""``flash_attn_with_kvcache`` against an fp64 reference, in Triton's interpreter (CPU).

Contiguous and paged caches (page sizes 1, 16, 64 and 256, shuffled block tables), per-sequence
lengths including 0 and 1, GQA 1/4/8, one and several new tokens, causal both, a sliding
window, soft-capping, explicit and automatic split counts, appends (exactly the new rows
written, in K and V), LSE, rows that see no key (output exactly 0, LSE -inf), a strided q;
every bad input raising before anything is written to the cache; and the pure host
functions (split-count heuristic, per-arch defaults, the benchmark's HBM peak table).
Unused cache slots hold NaN: a kernel that reads past a sequence's end fails the test.
"""

import dataclasses
import math
import os
import sys

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
             append=True, seed=0, Hkv=2, capacity=96, strided_q=False):
    from rocmflash import flash_attn_with_kvcache

    gen = torch.Generator().manual_seed(seed)
    B = len(lengths)
    kc, vc, table = make_cache(B, Hkv, D, capacity, page, dtype, gen)
    for b, n in enumerate(lengths):
        fill(kc, table, b, n, page, gen)
        fill(vc, table, b, n, page, gen)
    q = torch.randn(B, Sq, Hkv * group, D + 16 * strided_q, generator=gen).to(dtype)[..., :D]
    assert q.is_contiguous() != strided_q
    k_new = torch.randn(B, Sq, Hkv, D, generator=gen).to(dtype) if append else None
    v_new = torch.randn(B, Sq, Hkv, D, generator=gen).to(dtype) if append else None
    before_k, before_v = kc.clone(), vc.clone()
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
        assert torch.equal(vals[:n], cache_rows(before_v, table, b, n, page))
        ref, ref_lse = attention_fp64(q[b], keys, vals, 1 / math.sqrt(D), causal, window, softcap)
        assert rel_err(out[b], ref) < TOL[dtype], b
        seen = torch.isfinite(ref_lse)  # (Hq, Sq)
        assert torch.equal(torch.isfinite(lse[b]), seen)
        assert (out[b].transpose(0, 1)[~seen] == 0).all()  # rows that see no key: exactly 0
        if seen.any():
            assert (lse[b][seen].double() - ref_lse[seen]).abs().max().item() < 1e-3
    # nothing outside the appended rows changed (NaN-aware): with the checks above (the new rows hold
    # k_new/v_new, the old ones are intact), at most B * new changed rows means exactly those rows
    for after, before in ((kc, before_k), (vc, before_v)):
        changed = ~((after == before) | (after.isnan() & before.isnan()))
        assert int(changed.any(-1).any(-1).sum()) <= B * new


@pytest.mark.parametrize("page", [0, 1, 16, 64])
@pytest.mark.parametrize("group", [1, 4, 8])
def test_decode_one_token(interpret, page, group):
    run_case([0, 1, 57, 90], 1, group, 64, torch.bfloat16, page, seed=page + group, num_splits=3)


@pytest.mark.parametrize("page,Sq", [(0, 1), (0, 3), (16, 1), (16, 3)])
def test_decode_one_sequence(interpret, page, Sq):
    """B=1: a contiguous cache's append writes through a view of its one sequence (no batch index)."""
    run_case([57], Sq, 4, 64, torch.bfloat16, page, seed=31 + Sq + page, num_splits=2)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("page", [0, 16])
def test_decode_several_tokens(interpret, causal, page):
    run_case([5, 33, 80], 4, 4, 80, torch.float16, page, causal=causal, seed=7 + causal)


def test_decode_window_and_softcap(interpret):
    run_case([40, 90], 2, 2, 64, torch.bfloat16, 16, causal=True, window=(20, -1), softcap=8.0, num_splits=2,
             seed=3)


def test_decode_large_shuffled_pages(interpret):
    """Pages of 256 (a key block never straddles a page: one page lookup per block), shuffled."""
    run_case([0, 1, 257, 299], 1, 4, 64, torch.bfloat16, 256, capacity=300, num_splits=3, seed=13)


def test_decode_rows_without_keys(interpret):
    """No append, causal, Sq=4: sequences of 0 and 2 keys leave whole / partial rows with no key."""
    run_case([0, 2, 40], 4, 2, 64, torch.float16, 0, causal=True, append=False, num_splits=3, seed=17)


def test_decode_strided_q_and_window_without_causal(interpret):
    """q a non-contiguous view; a two-sided window (left and right bounded, not causal)."""
    run_case([30, 70], 3, 4, 80, torch.bfloat16, 16, causal=False, window=(10, 1), seed=19, strided_q=True)


@pytest.mark.parametrize("num_splits", [0, 1, 5])
def test_decode_split_counts_agree(interpret, num_splits):
    run_case([90, 17], 1, 8, 128, torch.bfloat16, 0, num_splits=num_splits, seed=11)


def test_one_split_writes_the_output_itself(interpret):
    """num_splits=1: one launch (no combine), same answers: paged, windowed, soft-capped, strided q, empty rows."""
    from rocmflash.kernels.common import observe_launches

    with observe_launches() as seen:
        run_case([0, 1, 57, 90], 2, 4, 64, torch.bfloat16, 16, window=(30, -1), softcap=6.0, num_splits=1,
                 seed=23, strided_q=True)
    assert [r["kernel"] for r in seen] == ["_append_rows", "_decode_split"]  # the new keys' append, then no combine
    with observe_launches() as seen:
        run_case([0, 1, 57, 90], 2, 4, 64, torch.bfloat16, 16, window=(30, -1), softcap=6.0, num_splits=2,
                 seed=23, strided_q=True)
    assert [r["kernel"] for r in seen] == ["_append_rows", "_decode_split", "_decode_combine"]


def test_one_split_without_lse(interpret):
    """The direct path with no LSE to store matches the split + combine path."""
    from rocmflash import flash_attn_with_kvcache

    gen = torch.Generator().manual_seed(29)
    q = torch.randn(2, 1, 8, 64, generator=gen).to(torch.float16)
    kc = torch.randn(2, 70, 2, 64, generator=gen).to(torch.float16)
    vc = torch.randn(2, 70, 2, 64, generator=gen).to(torch.float16)
    lens = torch.tensor([33, 70], dtype=torch.int32)
    one = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, num_splits=1)
    three = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, num_splits=3)
    for b, n in enumerate((33, 70)):
        ref, _ = attention_fp64(q[b], kc[b, :n], vc[b, :n], 1 / math.sqrt(64))
        assert rel_err(one[b], ref) < 1e-2 and rel_err(three[b], ref) < 1e-2


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


@pytest.mark.parametrize("D", [32, 40])
def test_decode_over_a_cache_one_key_longer_each_call(interpret, D):
    """transformers' dynamic cache: each call a new (B, Hkv, L, D) tensor, L one longer, read as (B, L, Hkv, D)
    with no cache_seqlens (one plan without the length; its capacity, config and split count per call). D=40:
    the strides L*40 are multiples of 16 only for even L (the kernel's KV_ALIGNED hint off for odd L). Causal
    and a per-sequence length tensor (a masked step) too."""
    from rocmflash import flash_attn_with_kvcache

    gen = torch.Generator().manual_seed(D)
    q = torch.randn(2, 1, 4, D, generator=gen).to(torch.float16)
    for L in range(253, 261):
        kc, vc = (torch.randn(2, 2, L, D, generator=gen).to(torch.float16).transpose(1, 2) for _ in range(2))
        out = flash_attn_with_kvcache(q, kc, vc, causal=L % 2 == 0)
        lens = torch.tensor([L, L - 7], dtype=torch.int32)
        part = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens)
        for b in range(2):
            ref, _ = attention_fp64(q[b], kc[b], vc[b], 1 / math.sqrt(D))
            assert rel_err(out[b], ref) < 1e-2, (L, b)
            ref, _ = attention_fp64(q[b], kc[b, :int(lens[b])], vc[b, :int(lens[b])], 1 / math.sqrt(D))
            assert rel_err(part[b], ref) < 1e-2, (L, b)


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
    # the cache and the new keys: ndim, dtype, device, head dim
    (lambda a: dict(k_cache=a["k_cache"].to(torch.bfloat16)), TypeError, "k_cache.dtype"),
    (lambda a: dict(v_cache=a["v_cache"][0]), ValueError, "v_cache must be 4-D"),
    (lambda a: dict(k_cache=a["k_cache"].to("meta"), v_cache=a["v_cache"].to("meta")), ValueError, "k_cache is on"),
    (lambda a: dict(k=a["k"].to("meta")), ValueError, "k is on"),
    (lambda a: dict(v=a["v"].to(torch.bfloat16)), TypeError, "v.dtype"),
    (lambda a: dict(k_cache=torch.zeros(*a["k_cache"].shape[:3], 48).to(torch.float16),
                    v_cache=torch.zeros(*a["k_cache"].shape[:3], 48).to(torch.float16)), ValueError, "head dim"),
    (lambda a: dict(v=a["v"][:, :, :1]), ValueError, "k and v must have the same shape"),
    # block table and lengths
    (lambda a: dict(block_table=a["block_table"][0]), ValueError, "block_table must be 2-D"),
    (lambda a: dict(block_table=a["block_table"].to("meta")), ValueError, "block_table is on"),
    (lambda a: dict(block_table=a["block_table"].clone().fill_(-1)), ValueError, "block_table[0]"),
    (dict(cache_seqlens=torch.tensor([[3, 10]], dtype=torch.int32)), ValueError, "cache_seqlens must be 1-D"),
    (dict(cache_seqlens=torch.tensor([3, 64])), ValueError, "cache_seqlens[1]"),  # int64, one past the end
    (dict(cache_seqlens=64), ValueError, "cache_seqlens=64"),
    # options
    (dict(window_size=(0, -2)), ValueError, "window_size"),
    (dict(softcap=float("inf")), ValueError, "softcap"),
    (dict(softcap=float("nan")), ValueError, "softcap"),
    (dict(softmax_scale=float("nan")), ValueError, "softmax_scale"),
    (dict(num_splits=1.5), ValueError, "num_splits"),
])
def test_decode_bad_input_raises_before_writing(interpret, change, exc, words):
    from rocmflash import flash_attn_with_kvcache

    args = _args()
    kc, vc = args["k_cache"], args["v_cache"]
    before = kc.clone(), vc.clone()
    args.update(change(args) if callable(change) else change)
    with pytest.raises(exc) as info:  # values checked on the host: check_values=True (the default checks on the GPU)
        flash_attn_with_kvcache(**args, check_values=True)
    assert words in str(info.value)
    assert torch.equal(kc, before[0]) and torch.equal(vc, before[1])


def test_decode_contiguous_cache_overflow(interpret):
    from rocmflash import flash_attn_with_kvcache

    args = _args(page=0)
    args["cache_seqlens"] = 64  # full: no room for the new key
    with pytest.raises(ValueError, match="does not fit"):
        flash_attn_with_kvcache(**args)


def test_decode_accepts_unused_bad_pages_and_any_length_type(interpret):
    """Only the pages a sequence uses are checked; int, int32 and int64 lengths give the same result."""
    from rocmflash import flash_attn_with_kvcache

    base = _args()
    gen = torch.Generator().manual_seed(2)
    base["k_cache"].copy_(torch.randn(base["k_cache"].shape, generator=gen))
    base["v_cache"].copy_(torch.randn(base["v_cache"].shape, generator=gen))
    base["block_table"][:, 1:] = 10 ** 6  # never used: sequences hold at most 11 keys of pages of 16
    outs = []
    for lens in (torch.tensor([10, 10], dtype=torch.int32), torch.tensor([10, 10]), 10):
        args = dict(base, k_cache=base["k_cache"].clone(), v_cache=base["v_cache"].clone(), cache_seqlens=lens)
        outs.append(flash_attn_with_kvcache(**args, num_splits=2))
        assert not torch.equal(args["k_cache"], base["k_cache"])  # the new key was appended
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


# ----------------------------------------------------------------------------- pure host functions
def test_choose_num_splits_heuristic():
    from rocmflash.kernels.decode.host import choose_num_splits

    # B=1, Hkv=8, 64k keys on 304 CUs: enough programs (>= 2 per CU) but capped at 64
    assert choose_num_splits(1, 8, 65536, 64, 304) == 64
    # enough programs already: one split
    assert choose_num_splits(64, 8, 65536, 64, 132) == 1
    # each split keeps >= 256 keys: 1024 keys -> at most 4 splits
    assert choose_num_splits(1, 1, 1024, 64, 304) == 4
    # never more splits than key blocks, never fewer than one
    assert choose_num_splits(1, 1, 300, 256, 304) == 1
    assert choose_num_splits(1, 1, 1, 16, 304) == 1
    # a pipelined loop needs about one program per SM (H100 sweep): B8 Hkv4 on 132 SMs -> 4 splits,
    # B32 Hkv4 -> 1; a one-stage loop about two (8, and round(264/128) = 2)
    assert choose_num_splits(8, 4, 32768, 64, 132, programs_per_cu=1) == 4
    assert choose_num_splits(32, 4, 32768, 64, 132, programs_per_cu=1) == 1
    assert choose_num_splits(8, 4, 32768, 64, 132, programs_per_cu=2) == 8
    assert choose_num_splits(32, 4, 32768, 64, 132, programs_per_cu=2) == 2
    for b, h, s, n, cu in [(1, 8, 2048, 64, 132), (8, 4, 8192, 32, 304), (3, 2, 300, 32, 132)]:
        k = choose_num_splits(b, h, s, n, cu)
        assert 1 <= k <= min(64, -(-s // n))
        assert k == 1 or s // k >= 256


def test_decode_default_configs_per_arch():
    from rocmflash.kernels.decode.host import DecodeConfig, default_decode_config

    amd = default_decode_config("gfx942", 128)
    assert (amd.num_stages, amd.waves_per_eu) == (1, 2)
    assert amd.kernel_config().compile_options("hip")["waves_per_eu"] == 2
    assert default_decode_config("gfx90a", 256).BLOCK_N == 32  # wide heads: halve the key block
    nv = default_decode_config("sm_90", 128)
    assert nv.waves_per_eu == 0 and nv.num_stages >= 2
    cpu = default_decode_config(None, 128)
    assert cpu.BLOCK_N <= 32  # small under the interpreter
    for cfg in (amd, nv, cpu):
        assert isinstance(cfg, DecodeConfig) and cfg.validate() is cfg
        with pytest.raises(dataclasses.FrozenInstanceError):
            cfg.BLOCK_N = 16


def test_decode_config_hook_without_gpu(interpret):
    from rocmflash.api.decode import decode_config
    from rocmflash.kernels.decode.host import default_decode_config

    if torch.cuda.is_available():
        pytest.skip("the interpreter reads the live GPU's config when there is one")
    assert decode_config(torch.device("cpu"), 64, torch.float16, 4, 96, 2) == default_decode_config(None, 64)


def test_bench_hbm_peak_table():
    import importlib.util

    bench = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks")
    spec = importlib.util.spec_from_file_location("rocmflash_bench_decode", os.path.join(bench, "decode.py"))
    bench_decode = importlib.util.module_from_spec(spec)
    sys.path.insert(0, bench)  # it imports its sibling ``interleaved``
    try:
        spec.loader.exec_module(bench_decode)
    finally:
        sys.path.remove(bench)
    assert bench_decode.hbm_peak("NVIDIA H100 80GB HBM3") == 3350
    assert bench_decode.hbm_peak("NVIDIA H200") == 4800
    assert bench_decode.hbm_peak("AMD Instinct MI300X") == 5300
    assert bench_decode.hbm_peak("AMD Instinct MI250X") == 3277
    assert math.isnan(bench_decode.hbm_peak("some other GPU"))
