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


def test_gpu_fused_merge_is_deterministic_under_load_and_across_streams():
    """The last split of each (sequence, K/V head) merges what the others wrote: 64 x 4 groups of 16
    splits (4096 programs racing to arrive), called 30 times eagerly, then on two streams at
    once (each stream its own counters), then replayed from a graph. The merge reads every split
    in a fixed order, so every result must equal the first bit for bit -- a partial read before its
    writer finished, or a counter shared between streams, would not -- and match the combine kernel
    and an fp32 reference."""
    from rocmflash.kernels import kv_decode as KD
    from rocmflash.kernels import masks as M

    gen = torch.Generator(device="cuda").manual_seed(5)
    B, L, Hq, Hkv, D, splits = 64, 2048, 32, 4, 128, 16
    kc, vc, _ = _cache(B, L, Hkv, D, 0, gen)
    q = torch.randn(B, 1, Hq, D, device="cuda", generator=gen).to(torch.bfloat16)
    lens = torch.randint(1, L, (B,), device="cuda", generator=gen).int()
    call = KD.DecodeCall(B, 1, Hkv, Hq // Hkv, D, False, 0, D ** -0.5, 0.0, *M.band_offsets(True, (-1, -1)))
    cfg = KD.DecodeConfig(BLOCK_N=32, num_warps=4, num_stages=2)

    def run(fused=True):
        out = torch.full_like(q, float("nan"))
        KD.launch(call, q, kc, vc, lens, lens, cfg, splits, out, fused=fused)
        return out

    first = run()
    eager = [run() for _ in range(30)]
    streams = [torch.cuda.Stream() for _ in range(2)]
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
    on_streams = []
    for _ in range(10):
        for s in streams:
            with torch.cuda.stream(s):
                on_streams.append(run())
    for s in streams:
        torch.cuda.current_stream().wait_stream(s)
    graph_out = torch.full_like(q, float("nan"))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        KD.launch(call, q, kc, vc, lens, lens, cfg, splits, graph_out)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        KD.launch(call, q, kc, vc, lens, lens, cfg, splits, graph_out)
    replays = []
    for _ in range(10):
        graph_out.fill_(float("nan"))
        graph.replay()
        replays.append(graph_out.clone())
    combined = run(fused=False)
    torch.cuda.synchronize()
    for i, out in enumerate(eager + on_streams + replays):
        assert torch.equal(out, first), i
    assert (first.float() - combined.float()).abs().max().item() <= 2 ** -6
    for b in (0, 17, B - 1):
        n = int(lens[b])
        k = kc[b, :n].float().repeat_interleave(Hq // Hkv, 1)
        v = vc[b, :n].float().repeat_interleave(Hq // Hkv, 1)
        p = torch.softmax(torch.einsum("hd,khd->hk", q[b, 0].float(), k) / math.sqrt(D), -1)
        ref = torch.einsum("hk,khd->hd", p, v)
        assert ((first[b, 0].float() - ref).norm() / ref.norm()).item() < 2e-2, b
