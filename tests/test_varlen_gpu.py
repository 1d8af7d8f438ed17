"""GPU: ``flash_attn_varlen_func`` at real sizes (a 16k-token pack) against references computed on the GPU.

Forward against fp32 SDPA-math per sequence (explicit band mask); gradients of a 4k-token
pack against fp64 autograd of the same reference; a CUDA/HIP graph capture of forward +
backward replays to the same bits. Outputs are NaN-poisoned by the kernels' own buffers
being checked finite (every row is written).
"""

import math

import pytest
import torch

from varlen_reference import band_mask, rel_err

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("compiled")]


def _pack(lengths_q, lengths_k, hq, hkv, d, dtype, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    cu_q = torch.tensor([0] + torch.tensor(lengths_q).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0] + torch.tensor(lengths_k).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    q = torch.randn(sum(lengths_q), hq, d, device="cuda", generator=gen).to(dtype)
    k = torch.randn(sum(lengths_k), hkv, d, device="cuda", generator=gen).to(dtype)
    v = torch.randn(sum(lengths_k), hkv, d, device="cuda", generator=gen).to(dtype)
    return q, k, v, cu_q, cu_k


def _reference(q, k, v, cu_q, cu_k, causal, window, softcap, dtype=torch.float32):
    """Per sequence, in ``dtype`` on the GPU: (out, lse (Hq, total_q))."""
    outs, lses = [], []
    cu_q, cu_k = cu_q.tolist(), cu_k.tolist()
    scale = 1 / math.sqrt(q.shape[-1])
    group = q.shape[1] // k.shape[1]
    for b in range(len(cu_q) - 1):
        qs = q[cu_q[b]:cu_q[b + 1]].to(dtype).transpose(0, 1)
        ks = k[cu_k[b]:cu_k[b + 1]].to(dtype).repeat_interleave(group, 1).transpose(0, 1)
        vs = v[cu_k[b]:cu_k[b + 1]].to(dtype).repeat_interleave(group, 1).transpose(0, 1)
        s = qs @ ks.transpose(1, 2) * scale
        if softcap:
            s = softcap * torch.tanh(s / softcap)
        s = s.masked_fill(~band_mask(qs.shape[1], ks.shape[1], causal, window).to(s.device), float("-inf"))
        lse = torch.logsumexp(s, -1)
        p = torch.nan_to_num(torch.exp(s - lse[..., None]), nan=0.0)
        outs.append((p @ vs).transpose(0, 1))
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses, 1)


@pytest.mark.parametrize("causal,window,softcap", [(True, (-1, -1), 0.0), (False, (-1, -1), 0.0),
                                                   (True, (511, -1), 0.0), (True, (-1, -1), 30.0)],
                         ids=["causal", "full", "window512", "softcap"])
def test_gpu_varlen_16k_pack_forward(causal, window, softcap):
    from rocmflash import flash_attn_varlen_func

    gen = torch.Generator().manual_seed(7)
    lengths = torch.randint(1, 3000, (12,), generator=gen).tolist()
    lengths += [0, 1, 16384 - sum(lengths) - 1] if sum(lengths) < 16383 else [0, 1]
    q, k, v, cu_q, cu_k = _pack(lengths, lengths, 32, 8, 128, torch.bfloat16, seed=1)
    out, lse = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lengths), max(lengths), causal=causal,
                                      window_size=window, softcap=softcap, return_lse=True)
    torch.cuda.synchronize()
    ref, ref_lse = _reference(q, k, v, cu_q, cu_k, causal, window, softcap)
    assert torch.isfinite(out).all()
    assert rel_err(out, ref) < 2e-2
    assert (lse - ref_lse).abs().max().item() < 1e-2


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal,window,softcap", [(True, (-1, -1), 0.0), (False, (100, 30), 20.0)],
                         ids=["causal", "window-softcap"])
def test_gpu_varlen_gradients(dtype, causal, window, softcap):
    from rocmflash import flash_attn_varlen_func

    lengths_q = [1, 777, 0, 1025, 2000]
    lengths_k = [3, 777, 5, 1025, 2100]
    q, k, v, cu_q, cu_k = _pack(lengths_q, lengths_k, 8, 2, 96, dtype, seed=3)
    for t in (q, k, v):
        t.requires_grad_(True)
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), causal=causal,
                                 window_size=window, softcap=softcap)
    do = torch.randn_like(out)
    out.backward(do)
    qd, kd, vd = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    ref, _ = _reference(qd, kd, vd, cu_q, cu_k, causal, window, softcap, torch.float64)
    ref.backward(do.double())
    tol = 1e-2 if dtype == torch.float16 else 2e-2
    assert rel_err(out, ref) < tol
    for name, got, want in (("dq", q.grad, qd.grad), ("dk", k.grad, kd.grad), ("dv", v.grad, vd.grad)):
        assert torch.isfinite(got).all(), name
        assert rel_err(got, want) < 2 * tol, name


def test_gpu_varlen_graph_replay():
    """Forward + backward captured in a CUDA/HIP graph: replay gives the eager bits."""
    from rocmflash import flash_attn_varlen_func

    lengths = [300, 1, 1200, 64]
    q, k, v, cu_q, cu_k = _pack(lengths, lengths, 16, 4, 128, torch.bfloat16, seed=5)
    for t in (q, k, v):
        t.requires_grad_(True)
    do = torch.randn_like(q)

    def step():
        for t in (q, k, v):
            t.grad = None
        out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 1200, 1200, causal=True)
        out.backward(do)
        return out.detach(), q.grad, k.grad, v.grad

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        eager = [t.clone() for t in step()]  # warm-up: compiles, fills the launch cache
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    for t in (q, k, v):
        t.grad = None
    with torch.cuda.graph(graph):
        captured = step()
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(captured, eager):
        assert torch.equal(a, b)
