"""GPU: ``flash_attn_with_kvcache`` at real sizes (B 1..64, KV 1k..64k, D=128, GQA 8:1, bf16), contiguous and
paged (pages of 16 and 256, shuffled), against an fp32 reference on the GPU; a captured decode step replays
to the eager bits."""

import math

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("compiled")]


def _cache(B, L, Hkv, D, page, gen):
    if page:
        pages = -(-L // page)
        k = torch.randn(B * pages + 3, page, Hkv, D, device="cuda", generator=gen).to(torch.bfloat16)
        table = torch.randperm(B * pages + 3, device="cuda", generator=gen)[:B * pages].view(B, pages).int()
    else:
        k = torch.randn(B, L, Hkv, D, device="cuda", generator=gen).to(torch.bfloat16)
        table = None
    return k, torch.randn_like(k.float()).to(torch.bfloat16), table


def _keys(cache, table, b, n, page):
    if table is None:
        return cache[b, :n]
    idx = torch.arange(n, device="cuda")
    return cache[table[b][idx // page].long(), idx % page]


@pytest.mark.parametrize("B,L", [(1, 65536), (8, 8192), (64, 1024), (4, 3000)])
@pytest.mark.parametrize("page", [0, 16, 256])
def test_gpu_decode_matches_reference(B, L, page):
    from rocmflash import flash_attn_with_kvcache

    gen = torch.Generator(device="cuda").manual_seed(B + L + page)
    Hq, Hkv, D = 32, 4, 128
    kc, vc, table = _cache(B, L, Hkv, D, page, gen)
    lens = torch.randint(L // 2, L, (B,), device="cuda", generator=gen).int()
    lens[0] = L - 1
    q = torch.randn(B, 1, Hq, D, device="cuda", generator=gen).to(torch.bfloat16)
    kn = torch.randn(B, 1, Hkv, D, device="cuda", generator=gen).to(torch.bfloat16)
    vn = torch.randn(B, 1, Hkv, D, device="cuda", generator=gen).to(torch.bfloat16)
    out = flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=lens, block_table=table, causal=True)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all()
    for b in range(B):
        n = int(lens[b]) + 1
        k = _keys(kc, table, b, n, page).float().repeat_interleave(Hq // Hkv, 1)
        v = _keys(vc, table, b, n, page).float().repeat_interleave(Hq // Hkv, 1)
        assert torch.equal(_keys(kc, table, b, n, page)[-1], kn[b, 0])  # the appended key
        p = torch.softmax(torch.einsum("hd,khd->hk", q[b, 0].float(), k) / math.sqrt(D), -1)
        ref = torch.einsum("hk,khd->hd", p, v)
        err = ((out[b, 0].float() - ref).norm() / ref.norm()).item()
        assert err < 2e-2, (b, err)


@pytest.mark.parametrize("B,L", [(8, 8192), (32, 2048)])
@pytest.mark.parametrize("page", [0, 16, 256])
def test_gpu_decode_left_padded_matches_reference(B, L, page):
    """``cache_leftpad``: sequence b is keys [start, end); the keys before the start hold NaN (never read)."""
    from rocmflash import flash_attn_with_kvcache

    gen = torch.Generator(device="cuda").manual_seed(7 * B + L + page)
    Hq, Hkv, D = 32, 4, 128
    kc, vc, table = _cache(B, L, Hkv, D, page, gen)
    lens = torch.randint(L // 2, L, (B,), device="cuda", generator=gen).int()
    starts = (torch.rand(B, device="cuda", generator=gen) * lens).int()
    starts[0] = int(lens[0]) + 1  # a sequence of no key: output 0
    for b in range(B):
        s = int(starts[b])
        if table is None:
            kc[b, :s] = float("nan")
            vc[b, :s] = float("nan")
        else:
            idx = torch.arange(s, device="cuda")
            kc[table[b][idx // page].long(), idx % page] = float("nan")
            vc[table[b][idx // page].long(), idx % page] = float("nan")
    q = torch.randn(B, 1, Hq, D, device="cuda", generator=gen).to(torch.bfloat16)
    kn = torch.randn(B, 1, Hkv, D, device="cuda", generator=gen).to(torch.bfloat16)
    vn = torch.randn(B, 1, Hkv, D, device="cuda", generator=gen).to(torch.bfloat16)
    out = flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=lens, block_table=table, causal=True,
                                  cache_leftpad=starts)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all()
    assert (out[0] == 0).all()
    for b in range(1, B):
        s, n = int(starts[b]), int(lens[b]) + 1
        k = _keys(kc, table, b, n, page)[s:].float().repeat_interleave(Hq // Hkv, 1)
        v = _keys(vc, table, b, n, page)[s:].float().repeat_interleave(Hq // Hkv, 1)
        p = torch.softmax(torch.einsum("hd,khd->hk", q[b, 0].float(), k) / math.sqrt(D), -1)
        ref = torch.einsum("hk,khd->hd", p, v)
        err = ((out[b, 0].float() - ref).norm() / ref.norm()).item()
        assert err < 2e-2, (b, err)


@pytest.mark.parametrize("splits", [1, 3])
def test_gpu_decode_split_counts_agree_with_lse(splits):
    """One split (the split kernel writes out and LSE itself) and three (split + combine): same answers."""
    from rocmflash import flash_attn_with_kvcache

    gen = torch.Generator(device="cuda").manual_seed(17)
    B, L, Hq, Hkv, D = 16, 2048, 32, 4, 128
    kc, vc, table = _cache(B, L, Hkv, D, 0, gen)
    lens = torch.randint(1, L, (B,), device="cuda", generator=gen).int()
    lens[1] = 0  # a sequence with an empty cache: output 0, LSE -inf
    q = torch.randn(B, 1, Hq, D, device="cuda", generator=gen).to(torch.bfloat16)
    out, lse = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, num_splits=splits, return_lse=True)
    torch.cuda.synchronize()
    assert (out[1] == 0).all() and torch.isneginf(lse[1]).all()
    for b in (0, 2, B - 1):
        n = int(lens[b])
        k = kc[b, :n].float().repeat_interleave(Hq // Hkv, 1)
        v = vc[b, :n].float().repeat_interleave(Hq // Hkv, 1)
        s = torch.einsum("hd,khd->hk", q[b, 0].float(), k) / math.sqrt(D)
        ref = torch.einsum("hk,khd->hd", torch.softmax(s, -1), v)
        assert ((out[b, 0].float() - ref).norm() / ref.norm()).item() < 2e-2
        assert (lse[b, :, 0] - torch.logsumexp(s, -1)).abs().max().item() < 1e-3


def test_gpu_decode_graph_replay():
    from rocmflash import flash_attn_with_kvcache

    gen = torch.Generator(device="cuda").manual_seed(3)
    kc, vc, table = _cache(8, 4096, 8, 128, 256, gen)
    q = torch.randn(8, 1, 64, 128, device="cuda", generator=gen).to(torch.bfloat16)
    lens = torch.full((8,), 4000, dtype=torch.int32, device="cuda")

    def step():
        return flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        eager = step().clone()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)


@pytest.mark.parametrize("D", [128, 40])
def test_gpu_a_cache_one_key_longer_each_call_replays_bit_for_bit(D, monkeypatch):
    """transformers' dynamic cache, eager: a new (B, Hkv, L, D) tensor each call, L one longer. After the first
    call every split launch replays one plan (LENGTH_ARGS unspecialised); each output equals the same call
    launched through Triton's JIT with no plan kept, bit for bit, and an fp32 reference. D=40: the K/V strides
    are multiples of 16 only for even L (KV_ALIGNED on and off)."""
    from rocmflash import flash_attn_with_kvcache
    from rocmflash.kernels import launch as L

    gen = torch.Generator(device="cuda").manual_seed(D)
    q = torch.randn(2, 1, 16, D, device="cuda", generator=gen).to(torch.bfloat16)
    monkeypatch.setattr(L, "FAST_LAUNCH", True)
    for length in range(4100, 4108):  # one split count for all (16 for 4096..4351 keys at B2 Hkv2 on 132 SMs)
        k, v = (torch.randn(2, 2, length, D, device="cuda", generator=gen).to(torch.bfloat16).transpose(1, 2)
                for _ in range(2))
        plans = len(L._PLANS)
        got = flash_attn_with_kvcache(q, k, v)
        if length > 4101:  # (D=40: the first even and the first odd length each make theirs)
            assert len(L._PLANS) == plans, "a new length left a new launch plan"
        monkeypatch.setattr(L, "FAST_LAUNCH", False)
        want = flash_attn_with_kvcache(q, k, v)
        monkeypatch.setattr(L, "FAST_LAUNCH", True)
        assert torch.equal(got, want), length
        ref = torch.nn.functional.scaled_dot_product_attention(
            q.float().transpose(1, 2), k.float().transpose(1, 2), v.float().transpose(1, 2), enable_gqa=True)
        err = ((got.float() - ref.transpose(1, 2)).norm() / ref.norm()).item()
        assert err < 1e-2, (length, err)
