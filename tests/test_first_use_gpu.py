"""The first-use decision on a live GPU: real event timing of rocmflash's call against SDPA's on a problem no shipped
entry covers, the record written, the served side right against fp64 (forward and gradients), nothing timed again,
and nothing timed inside a CUDA graph capture."""

import json
import math

import pytest
import torch

from rocmflash.api import first_use
from varlen_reference import rel_err

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU"),
              pytest.mark.usefixtures("fresh_selection", "compiled")]


def _fp64(q, k, v, causal):
    G = q.shape[1] // k.shape[1]
    qd, kd, vd = q.double(), k.double().repeat_interleave(G, 1), v.double().repeat_interleave(G, 1)
    s = qd @ kd.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        Sq, Sk = q.shape[2], k.shape[2]
        s = s.masked_fill(torch.ones(Sq, Sk, dtype=torch.bool, device=q.device).tril(Sk - Sq).logical_not(), float("-inf"))
    return torch.softmax(s, -1) @ vd


def _decide_count(monkeypatch):
    calls = []
    real = first_use.decide

    def counting(*args, **kwargs):
        calls.append(args[1])
        return real(*args, **kwargs)
    monkeypatch.setattr(first_use, "decide", counting)
    return calls


def test_first_use_times_once_records_and_serves_right(first_use_timing, monkeypatch):
    import rocmflash

    decided = _decide_count(monkeypatch)
    g = torch.Generator(device="cuda").manual_seed(0)
    # GQA 3:1 with D80: no shipped entry of any GPU covers it
    q, k, v = (torch.randn(2, h, 384, 80, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
               for h in (12, 4, 4))
    out = rocmflash.attention(q, k, v, causal=True)
    do = torch.randn_like(out)
    out.backward(do)
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = _fp64(qd, kd, vd, True)
    ref.backward(do.double())
    assert rel_err(out, ref) < 2e-2
    for got, want in ((q.grad, qd.grad), (k.grad, kd.grad), (v.grad, vd.grad)):
        assert rel_err(got, want) < 3e-2
    with torch.no_grad():
        out_fwd = rocmflash.attention(q, k, v, causal=True)
        rocmflash.attention(q, k, v, causal=True)
    assert rel_err(out_fwd, ref) < 2e-2
    assert decided == ["d80-bf16-causal-gqa3-q512-k512-bh32-train", "d80-bf16-causal-gqa3-q512-k512-bh32-fwd"]
    files = list(first_use_timing.glob("*.first-use.json"))
    assert len(files) == 1
    decisions = json.loads(files[0].read_text())["decisions"]
    for rec in decisions.values():
        assert rec["measured"] == "online" and rec["served_by"] in ("rocmflash", "sdpa")
        assert rec["rocmflash_ms"] > 0 and rec["sdpa_ms"] > 0
        assert rec["environment"]["device"] == torch.cuda.get_device_name()


def test_nothing_is_timed_inside_a_graph_capture(first_use_timing, monkeypatch):
    import rocmflash

    decided = _decide_count(monkeypatch)
    g = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.randn(1, h, 256, 112, device="cuda", dtype=torch.float16, generator=g) for h in (8, 2, 2))
    static_out = torch.empty_like(q)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm SDPA outside the capture (its first call may allocate workspace)
        torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out.copy_(rocmflash.attention(q, k, v))
    graph.replay()
    torch.cuda.synchronize()
    assert decided == [] and not list(first_use_timing.glob("*.first-use.json"))
    assert rel_err(static_out, _fp64(q, k, v, False)) < 2e-2
    rocmflash.attention(q, k, v)  # the first eager call decides
    assert decided == ["d112-fp16-full-gqa4-q256-k256-bh8-fwd"]
