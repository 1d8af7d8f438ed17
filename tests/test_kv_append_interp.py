"""The one-launch append of new keys/values into a 16-bit KV cache (``rocmflash.kernels.decode.append``), in Triton's
interpreter: the rows land where torch's index writes put them, the lengths it returns are ``cache_seqlens +
Sk_new``, a sequence with an out-of-range length or page stores nothing (nothing else in the cache, nothing outside
it is written; the error word says so), and ``flash_attn_with_kvcache`` answers as a reference that appends in torch
does. (Every bad value on every append path: ``test_kvcache_bad_values_interp.py``.)"""

from __future__ import annotations

import pytest
import torch

from rocmflash.kernels.decode import append as kv_append

pytestmark = pytest.mark.usefixtures("interpret")


def _reference(k_cache, v_cache, k, v, lens, block_table, page_size):
    """Torch's own writes: rows ``lens[b] + t``, none of a sequence whose length is outside ``0..capacity - new``
    or one of whose new rows' pages is outside the pool."""
    kc, vc = k_cache.clone(), v_cache.clone()
    B, new = k.shape[:2]
    capacity = block_table.shape[1] * page_size if block_table is not None else k_cache.shape[1]
    for b in range(B):
        start = int(lens[b])
        if not 0 <= start <= capacity - new:
            continue
        rows = range(start, start + new)
        if block_table is not None:
            pages = [int(block_table[b, pos // page_size]) for pos in rows]
            if not all(0 <= p < k_cache.shape[0] for p in pages):
                continue
        for t, pos in enumerate(rows):
            if block_table is None:
                kc[b, pos], vc[b, pos] = k[b, t], v[b, t]
            else:
                kc[pages[t], pos % page_size], vc[pages[t], pos % page_size] = k[b, t], v[b, t]
    return kc, vc


def _inputs(B, new, hkv, d, rows, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    k_cache = torch.randn(B, rows, hkv, d, generator=g).to(dtype)
    v_cache = torch.randn(B, rows, hkv, d, generator=g).to(dtype)
    k = torch.randn(B, new, hkv, d, generator=g).to(dtype)
    v = torch.randn(B, new, hkv, d, generator=g).to(dtype)
    return k_cache, v_cache, k, v


@pytest.mark.parametrize("B,new,d", [(1, 1, 64), (3, 1, 128), (2, 3, 80)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_contiguous_append_matches_torch_and_returns_the_new_lengths(B, new, d, dtype):
    k_cache, v_cache, k, v = _inputs(B, new, 2, d, 40, dtype, seed=B * 10 + new)
    lens = torch.tensor([5, 17, 0][:B], dtype=torch.int32)
    want_k, want_v = _reference(k_cache, v_cache, k, v, lens, None, 0)
    got_lens = kv_append.append(k_cache, v_cache, k, v, lens, None, 0, "cuda")
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)
    assert got_lens.dtype == torch.int32 and torch.equal(got_lens, lens + new)
    assert torch.equal(lens, torch.tensor([5, 17, 0][:B], dtype=torch.int32))  # the caller's lengths untouched


def test_paged_append_writes_through_the_block_table():
    B, new, hkv, d, page = 2, 2, 2, 64, 16
    g = torch.Generator().manual_seed(7)
    pool_k = torch.randn(6, page, hkv, d, generator=g).half()
    pool_v = torch.randn(6, page, hkv, d, generator=g).half()
    k = torch.randn(B, new, hkv, d, generator=g).half()
    v = torch.randn(B, new, hkv, d, generator=g).half()
    block_table = torch.tensor([[4, 1, 3], [0, 5, 2]], dtype=torch.int32)
    lens = torch.tensor([15, 33], dtype=torch.int32)  # the first straddles a page boundary
    want_k, want_v = _reference(pool_k, pool_v, k, v, lens, block_table, page)
    got_lens = kv_append.append(pool_k, pool_v, k, v, lens, block_table, page, "cuda")
    assert torch.equal(pool_k, want_k) and torch.equal(pool_v, want_v)
    assert torch.equal(got_lens, lens + new)


def test_out_of_range_lengths_and_pages_write_nothing():
    """A length past the end, a negative one and a page outside the pool store none of that sequence's rows (the
    good sequence's land); the memory right after the cache keeps its poison; the returned lengths keep the bad
    values for the decode kernel, and the error word names what was wrong."""
    from rocmflash.kernels.decode import host as KD
    from rocmflash.kernels.decode import checks as DC

    B, new, hkv, d, rows = 3, 2, 2, 32, 24
    store_k = torch.full((B * rows * hkv * d + 4096,), 7.0, dtype=torch.float16)
    store_v = store_k.clone()
    k_cache = store_k[:B * rows * hkv * d].view(B, rows, hkv, d)
    v_cache = store_v[:B * rows * hkv * d].view(B, rows, hkv, d)
    g = torch.Generator().manual_seed(3)
    k_cache.copy_(torch.randn(B, rows, hkv, d, generator=g))
    v_cache.copy_(torch.randn(B, rows, hkv, d, generator=g))
    k = torch.randn(B, new, hkv, d, generator=g).half()
    v = torch.randn(B, new, hkv, d, generator=g).half()
    lens = torch.tensor([rows + 50, -9, rows - new], dtype=torch.int32)
    want_k, want_v = _reference(k_cache, v_cache, k, v, lens, None, 0)
    assert not torch.equal(want_k, k_cache)  # (the good sequence appends)
    err = torch.zeros(1, dtype=torch.int32)
    got_lens = kv_append.append(k_cache, v_cache, k, v, lens, None, 0, "cuda", err=err)
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)
    assert bool((store_k[B * rows * hkv * d:] == 7.0).all()) and bool((store_v[B * rows * hkv * d:] == 7.0).all())
    assert torch.equal(got_lens, lens + new)
    assert int(err[0]) == DC.BAD_LENGTH.value | DC.NOT_STORED.value

    pool_k, pool_v, k1, v1 = _inputs(3, 1, hkv, d, 8, torch.float16, seed=4)  # 3 pages of 8 rows
    bt = torch.tensor([[1, 99], [-3, 0], [2, 0]], dtype=torch.int32)
    lens = torch.tensor([9, 2, 3], dtype=torch.int32)
    want_k, want_v = _reference(pool_k, pool_v, k1, v1, lens, bt, 8)
    err.zero_()
    kv_append.append(pool_k, pool_v, k1, v1, lens, bt, 8, "cuda", err=err)
    assert torch.equal(pool_k, want_k) and torch.equal(pool_v, want_v)
    assert int(err[0]) == DC.BAD_PAGE.value | DC.NOT_STORED.value


def test_flash_attn_with_kvcache_appends_and_attends_as_a_torch_reference():
    """The public call with new keys: the cache afterwards and the output equal a torch append followed by fp32
    attention over each sequence's keys (bottom-right causal, GQA 2:1)."""
    from rocmflash.api.decode import flash_attn_with_kvcache

    B, new, hq, hkv, d, rows = 2, 2, 4, 2, 64, 48
    k_cache, v_cache, k, v = _inputs(B, new, hkv, d, rows, torch.float16, seed=11)
    q = torch.randn(B, new, hq, d, generator=torch.Generator().manual_seed(12)).half()
    lens = torch.tensor([9, 30], dtype=torch.int32)
    want_k, want_v = _reference(k_cache, v_cache, k, v, lens, None, 0)
    out = flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lens, causal=True)
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)
    scale = d ** -0.5
    for b in range(B):
        L = int(lens[b]) + new
        keys = want_k[b, :L].float().repeat_interleave(hq // hkv, dim=1)  # (L, hq, d)
        vals = want_v[b, :L].float().repeat_interleave(hq // hkv, dim=1)
        s = torch.einsum("thd,lhd->htl", q[b].float(), keys) * scale
        pos = torch.arange(L)[None, None, :]
        s = s.masked_fill(pos > (L - new + torch.arange(new))[None, :, None], float("-inf"))
        ref = torch.einsum("htl,lhd->thd", torch.softmax(s, -1), vals)
        err = (out[b].float() - ref).norm() / ref.norm()
        assert err < 2e-3, err


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("arch", ["gfx90a", "gfx942", "gfx950", "sm_90"])
def test_append_kernel_cross_compiles(arch, paged, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    from rocmflash.config import KernelConfig
    from rocmflash.kernels import common as C

    cfg = KernelConfig(BLOCK_M=16, BLOCK_N=16, num_warps=1, num_stages=1)
    P = C.Ptr
    rows = 256 if paged else 4096
    args = dict(KN=P("*bf16"), VN=P("*bf16"), KC=P("*bf16"), VC=P("*bf16"), BT=P("*i32"), SEQLENS=P("*i32"),
                SEQ_OUT=P("*i32"), ERR=P("*i32"), **{f"stride_{n}": s for n, s in (
                    ("knb", 1024), ("knt", 1024), ("knh", 128), ("knd", 1), ("vnb", 1024), ("vnt", 1024),
                    ("vnh", 128), ("vnd", 1), ("kcb", rows * 1024), ("kcn", 1024), ("kch", 128), ("kcd", 1),
                    ("vcb", rows * 1024), ("vcn", 1024), ("vch", 128), ("vcd", 1), ("btb", 16 if paged else 0))},
                NEW=1, CAPACITY=4096, PAGE_SIZE=rows if paged else 1, NUM_BLOCKS=4112 if paged else 8)
    kernel = C.compile_kernel(kv_append._append_rows, arch, args, kv_append._constexprs(128, paged), cfg)
    if arch.startswith("gfx"):  # one warp per row: a few scalar integer ops more for the checks, no spill
        from isa_tools import kernel_summary, read_code_object

        (res,) = read_code_object(kernel.asm["hsaco"])
        s = kernel_summary(res, num_warps=kernel.metadata.num_warps, asm=kernel.asm["amdgcn"])
        assert s["arch"] == arch and s["vgpr_spill_count"] == 0 and s["scratch_bytes"] == 0, s
    else:
        assert kernel.asm["ptx"]
