"""GPU: a forward+backward attention step captures into a CUDA/HIP graph and replays with identical results.

Bit-for-bit equality needs a deterministic backward: the tests run under ``torch.use_deterministic_algorithms``,
which keeps training calls on rocmflash's kernels where the shipped database would serve the platform's SDPA
(its flash backward adds dQ with atomics: replay and eager then differ in the last bits)."""

import pytest
import torch

import rocmflash

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("compiled")]


@pytest.fixture
def deterministic():
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    yield
    torch.use_deterministic_algorithms(before)


@pytest.mark.parametrize("causal", [False, True])
def test_fwd_bwd_graph_replay_equals_eager(causal, deterministic):
    torch.manual_seed(0)
    shape_q, shape_kv = (2, 8, 384, 64), (2, 2, 384, 64)
    q = torch.randn(shape_q, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(shape_kv, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(shape_kv, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dout = torch.randn(shape_q, device="cuda", dtype=torch.bfloat16)

    def step():
        out = rocmflash.attention(q, k, v, causal=causal)
        out.backward(dout)
        return out

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream: compiles and selects configs
        for _ in range(3):
            step()
            q.grad = k.grad = v.grad = None
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = step()
    for _ in range(2):  # new inputs each replay, poisoned outputs: replay must recompute everything
        with torch.no_grad():
            for t in (q, k, v, dout):
                t.copy_(torch.randn_like(t))
            for t in (static_out, q.grad, k.grad, v.grad):
                t.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, k, v))
        ref = rocmflash.attention(q2, k2, v2, causal=causal)
        ref.backward(dout)
        assert torch.equal(static_out, ref)
        for got, want in ((q.grad, q2.grad), (k.grad, k2.grad), (v.grad, v2.grad)):
            assert torch.equal(got, want)
