"""The live runner's numeric gate (rocmflash.tuning.live_gate), on the CPU with stand-in kernels.

The gate keeps its inputs and fp32 reference per worker and shape (a long sequence's
reference costs more than a config's measurement), so it must still catch every way a
config can be wrong: unwritten output, a wrong answer, and a kernel writing into the very
inputs the next configs are gated on.
"""

import math

import pytest
import torch

from rocmflash.config import KernelConfig
from rocmflash.hw.roofline import Shape
from rocmflash.tuning import live_gate

SHAPE = Shape(batch=1, heads_q=4, heads_kv=2, seqlen_q=48, seqlen_k=80, head_dim=32, dtype="fp16", causal=True)
CFG = KernelConfig(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1)


@pytest.fixture(autouse=True)
def on_cpu(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the gate's tensors live on the CPU
    live_gate._GATE.clear()
    yield
    live_gate._GATE.clear()


class Kernel:
    """A stand-in forward: the exact answer (from the fp32 reference), then one deliberate fault."""

    def __init__(self, fault=None):
        self.fault = fault
        self.calls = []

    def launch(self, q, k, v, cfg, causal, scale, out):
        self.calls.append((q, k, v))
        ref = live_gate.reference(q, k, v, causal, scale).to(out.dtype)
        if self.fault == "unwritten":
            out[:, :, -1:] = ref[:, :, -1:]  # only the last row: the rest stays poisoned
            return
        out.copy_(ref * 1.05 if self.fault == "wrong" else ref)
        if self.fault == "writes_k":
            k[0, 0, 0, 0] += 1.0


def _gate(kernel, shape=SHAPE):
    return live_gate.gate(kernel, CFG, shape)


def test_a_right_answer_passes_and_the_inputs_are_kept_for_the_next_config():
    first, second = Kernel(), Kernel()
    ok, err, why = _gate(first)
    assert ok and err < 1e-3 and why == ""
    assert _gate(second)[0]
    assert all(a is b for a, b in zip(first.calls[0], second.calls[0]))  # same tensors: no second reference


def test_another_shape_draws_new_inputs():
    first, second = Kernel(), Kernel()
    _gate(first)
    other = Shape(**{**SHAPE.to_dict(), "seqlen_q": 64})
    assert _gate(second, other)[0]
    assert second.calls[0][0].shape[2] == 64 and second.calls[0][1] is not first.calls[0][1]


def test_unwritten_output_fails():
    ok, _, why = _gate(Kernel("unwritten"))
    assert not ok and "NaN/inf" in why and "unwritten" in why


def test_a_wrong_answer_fails_on_relative_error():
    ok, err, why = _gate(Kernel("wrong"))
    assert not ok and err == pytest.approx(0.05, rel=0.05) and "relative error" in why


def test_a_kernel_writing_into_its_inputs_fails_and_the_next_config_gets_fresh_inputs():
    bad, good = Kernel("writes_k"), Kernel()
    ok, _, why = _gate(bad)
    assert not ok and "wrote into its inputs" in why
    assert _gate(good)[0]  # would fail against the kept reference had the corrupted k been kept
    assert good.calls[0][1] is not bad.calls[0][1]


def test_the_reference_is_bottom_right_causal_with_gqa():
    q, k, v, ref = live_gate.gate_inputs(SHAPE)
    scale = 1.0 / math.sqrt(SHAPE.head_dim)
    # query row i of 48 sees keys 0 .. i + 32 (bottom-right aligned); head 3 reads KV head 1
    i = 5
    s = (q[0, 3, i].double() @ k[0, 1].double().T) * scale
    s[i + 32 + 1:] = -math.inf
    expect = torch.softmax(s, 0) @ v[0, 1].double()
    assert torch.allclose(ref[0, 3, i].double(), expect, rtol=1e-4, atol=1e-5)
