"""The one numeric gate (rocmflash.measure.gate) on the CPU: torch tensors and stand-in launches, fresh random
inputs each test. A right answer passes; an unwritten element, a wrong answer past its dtype's bound (fp8's
included) and a launch that writes its input each fail, and say why."""

import math
import subprocess
import sys

import pytest
import torch

from rocmflash import measure


def _problem(dtype=torch.float16):
    """Fresh q, k (16-bit), their fp32 "attention" reference ``softmax(q kᵀ) k`` and a poisonable output."""
    q, k = torch.randn(2, 24, 16, dtype=dtype), torch.randn(2, 32, 16, dtype=dtype)
    ref = torch.softmax(q.float() @ k.float().transpose(1, 2) / 4, -1) @ k.float()
    return q, k, ref, torch.empty(q.shape, dtype=dtype)


def _gate(write, dtype=torch.float16, bound="fp16"):
    q, k, ref, out = _problem(dtype)
    return measure.gate(lambda: write(out, ref, k), {"out": ref}, {"out": out}, {"q": q, "k": k}, bound)


def test_a_right_answer_passes():
    v = _gate(lambda out, ref, k: out.copy_(ref))
    assert v.passed and v.why == "" and 0 < v.rel_err < 1e-3 and set(v.errors) == {"out"}


def test_nan_poisoning_catches_an_unwritten_element():
    def one_short(out, ref, k):
        out.copy_(ref)
        out[1, -1, -1] = float("nan")  # stands for an element a tile skipped

    def unwritten(out, ref, k):
        out[:, :-1] = ref[:, :-1].to(out.dtype)  # the last query row left as the gate poisoned it

    assert not _gate(one_short).passed
    v = _gate(unwritten)
    assert not v.passed and math.isnan(v.rel_err) and "32 of 768 elements of out are NaN/inf" in v.why


@pytest.mark.parametrize("dtype, bound, scale, passed", [
    (torch.float16, "fp16", 1.005, True), (torch.float16, "fp16", 1.02, False),
    (torch.bfloat16, "bf16", 1.015, True), (torch.bfloat16, "bf16", 1.03, False),
    (torch.float16, "fp8", 1.05, True), (torch.float16, "fp8", 1.08, False),
    (torch.float16, torch.float8_e4m3fn, 1.05, True), (torch.float16, torch.float8_e5m2, 1.08, True)])
def test_a_wrong_answer_fails_by_relative_error_past_its_dtype_s_bound(dtype, bound, scale, passed):
    v = _gate(lambda out, ref, k: out.copy_(ref * scale), dtype, bound)
    assert v.rel_err == pytest.approx(scale - 1, rel=0.2)
    assert v.passed is passed, v
    if not passed:
        assert f"> {measure.tolerance(bound):g} against the fp32 reference" in v.why


def test_the_one_table_has_every_dtype_and_fp8_formats_their_own_roundoff():
    assert measure.TOLERANCE == {"fp16": 1e-2, "bf16": 2e-2, "fp8": 2.0 ** -4}
    assert measure.tolerance(torch.float8_e4m3fnuz) == 2.0 ** -4 and measure.tolerance(torch.float8_e5m2) == 2.0 ** -3
    assert measure.tolerance(torch.bfloat16) == 2e-2
    with pytest.raises(ValueError, match="no bound for dtype 'fp32'"):
        measure.tolerance("fp32")


def test_a_launch_that_writes_its_input_fails_and_names_it():
    def writes_k(out, ref, k):
        out.copy_(ref)
        k[0, 3, 1] += 0.5

    v = _gate(writes_k)
    assert not v.passed and v.inputs_written == ("k",) and v.why == "the kernel wrote into its inputs k"


def test_parts_compare_views_and_returned_outputs_join_the_buffers():
    q, k, ref, out = _problem()
    first = {"out": [(slice(None, 1), ref[:1])]}  # the first rows only (decode, the incumbent)
    wrong_tail = lambda: {"out": torch.cat([ref[:1], ref[1:] * 2]).half()}  # noqa: E731 - allocates its output
    assert measure.gate(wrong_tail, first, {}, {"q": q}, "fp16").passed
    both = {"out": [(slice(None, 1), ref[:1]), (slice(1, None), ref[1:])]}
    v = measure.gate(wrong_tail, both, {}, {"q": q}, "fp16")
    assert not v.passed and v.rel_err == pytest.approx(1.0, rel=0.01)  # the worst part counts
    with pytest.raises(ValueError, match="reference for \\['dq'\\] but no such output"):
        measure.gate(lambda: None, {"dq": ref}, {"out": out}, {}, "fp16")


def test_measure_is_a_lower_floor():
    code = "import rocmflash.measure, sys; print(sorted(m for m in sys.modules if m.startswith('rocmflash.')))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "rocmflash.tuning" not in loaded and "rocmflash.static" not in loaded, loaded
