"""The decode host margin: a dense decode-shaped call keeps the decode kernel only where its ``decode-`` entry's lead
would survive a host :data:`~rocmflash.api.incumbent.DECODE_HOST_SLOWDOWN` times slower (``decode_winner``, against
the floors of the smallest timed decode problem, ``decode_host_floor``) -- pure rules, then through every dense entry
point and ``rocmflash explain`` in Triton's interpreter (CPU)."""

import pytest
import torch

from rocmflash.api import incumbent
from rocmflash.api.incumbent import DECODE_TIMING, decode_host_floor, decode_winner
from rocmflash.kernels.launch import observe_launches
from test_decode_incumbent_interp import B, CFG, D, ENTRIES, HKV, HQ, SK, _decode_db, _entry_points, _qkv, _ref
from varlen_reference import rel_err

pytestmark = pytest.mark.usefixtures("fresh_selection")


def _field(sdpa_ms, triton_ms, backend="default"):
    return {"backend": backend, "time_ms": sdpa_ms, "triton_ms": triton_ms, "timing": DECODE_TIMING,
            "backends": {backend: {"status": "ok", "time_ms": sdpa_ms}}}


#: the floors of a host-bound smallest problem: rocmflash's route 74 µs, SDPA's 31 µs (the shipped H100 B1 2k entry)
FLOOR = _field(0.031, 0.074)


@pytest.fixture(autouse=True)
def _fresh_decode():
    from rocmflash.api import decode

    decode.clear_cache()
    yield
    decode.clear_cache()


def test_a_small_lead_within_the_host_margin_goes_to_sdpa():
    backend, why = decode_winner(_field(0.0982, 0.0977), FLOOR)  # B8 KV8k: 0.5 % ahead, 98 µs < 2 x 74 µs
    assert backend == "default" and why.startswith("host margin")
    assert "148.0" in why and "98.2" in why  # the slower host's times: 2 x 74 µs against SDPA's own 98.2


def test_a_lead_on_a_gpu_bound_call_keeps_the_kernel():
    assert decode_winner(_field(0.184, 0.1817), FLOOR)[0] is None  # above 2 x 74 µs: the GPU sets the pace
    backend, why = decode_winner(_field(0.160, 0.100), FLOOR)
    assert backend is None and "as fast or faster" in why
    # 30 % ahead, but SDPA's 130 µs is under the route's 148 µs on the slower host
    assert decode_winner(_field(0.130, 0.100), FLOOR)[0] == "default"


def test_the_entry_verdict_stands_without_a_floor_and_where_sdpa_won():
    assert decode_winner(_field(0.0982, 0.0977), None)[0] is None
    assert decode_winner(_field(0.031, 0.074), FLOOR) == ("default", "SDPA was faster (eager per call, host time "
                                                                     "included)")
    assert decode_winner(None, FLOOR)[0] is None
    assert decode_winner(_field(None, 0.05), FLOOR)[0] is None  # SDPA failed to run: nothing to serve
    # the entry as its own floor: both sides scale alike, the verdict stands
    assert decode_winner(_field(0.040, 0.030), _field(0.040, 0.030))[0] is None


def test_a_named_backend_within_margin_of_the_default_serves_the_default():
    field = _field(0.0980, 0.0977, backend="cudnn")
    field["backends"]["default"] = {"status": "ok", "time_ms": 0.0985}
    assert decode_winner(field, FLOOR)[0] == "default"
    field["backends"]["default"]["time_ms"] = 0.120  # SDPA's own choice far behind: the named backend
    assert decode_winner(field, FLOOR)[0] == "cudnn"


def _entry(field, **problem):
    return {"mode": "decode", "best": dict(CFG), "measured": True, "incumbent": field,
            "timing": "gpu graph replay (cold K/V copies)", **problem}


def test_the_floor_is_the_smallest_timed_problem(tmp_path, monkeypatch):
    from rocmflash.tuning.decode import decode_key

    extra = {decode_key(D, "fp16", 8, 256, 1): _entry(_field(0.031, 0.080)),   # the smallest problem: the floor
             decode_key(D, "fp16", 1, 256, 1): _entry(_field(0.032, 0.081)),   # as small, slower: not it
             decode_key(D, "fp16", 4, 4096, 8): _entry(_field(0.070, 0.060)),  # faster, but a larger problem
             decode_key(D, "fp16", 4, 128, 1, page_size=16): _entry(_field(0.01, 0.01)),  # paged: not it
             decode_key(D, "fp16", 4, 128, 1, kv_dtype="fp8e4m3fn"): _entry(_field(0.01, 0.01)),  # fp8: not it
             decode_key(D, "bf16", 4, 128, 1): _entry(_field(0.01, 0.01)),     # another dtype: not it
             decode_key(D, "fp16", 4, 128, 2): dict(_entry(_field(0.01, 0.01)), measured=False),  # not servable
             decode_key(D, "fp16", 2, 128, 1): _entry(dict(_field(0.01, 0.01), timing="gpu graph replay"))}
    path = _decode_db(tmp_path, monkeypatch, _field(0.0982, 0.0977), extra=extra)
    floor = decode_host_floor("h100", D, torch.float16, path)
    assert (floor["time_ms"], floor["triton_ms"]) == (0.031, 0.080)
    assert decode_host_floor("h100", D, torch.float16) == floor  # the GPU's databases: the same file
    assert decode_host_floor("h100", 64, torch.float16, path) is None and decode_host_floor(None, D, "fp16") is None


def _margin_db(tmp_path, monkeypatch):
    """The test problem's entry 0.5 % ahead of SDPA at 98 µs, and a B1 host floor of 74 µs (SDPA 31 µs)."""
    from rocmflash.tuning.decode import decode_key

    floor = {decode_key(D, "fp16", HQ // HKV, 128, 1): _entry(FLOOR)}
    return _decode_db(tmp_path, monkeypatch, _field(0.0982, 0.0977), extra=floor)


@pytest.mark.parametrize("entry", ENTRIES)
def test_every_dense_entry_point_serves_sdpa_within_the_margin(interpret, tmp_path, monkeypatch, sdpa_spy, entry):
    _margin_db(tmp_path, monkeypatch)
    q, k, v = _qkv(seed=3)
    with observe_launches() as seen:
        out = _entry_points()[entry](q, k, v)
    assert seen == [] and sdpa_spy == [("default", False)]
    assert rel_err(out, _ref(q, k, v)) < 1e-2


def test_no_incumbent_switch_still_runs_the_kernel(interpret, tmp_path, monkeypatch, sdpa_spy):
    import rocmflash
    from rocmflash.api.selection import NO_INCUMBENT_ENV

    _margin_db(tmp_path, monkeypatch)
    monkeypatch.setenv(NO_INCUMBENT_ENV, "1")
    q, k, v = _qkv(seed=4)
    with observe_launches() as seen:
        out = rocmflash.attention(q, k, v)
    assert "_decode_split" in {r["kernel"] for r in seen} and sdpa_spy == []
    assert rel_err(out, _ref(q, k, v)) < 1e-2


def test_explain_says_the_host_margin_decided(tmp_path, monkeypatch):
    from rocmflash.cli.explain import explain

    path = _margin_db(tmp_path, monkeypatch)
    fwd = explain("h100", D, "fp16", False, 1, seqlen_k=SK, gqa_ratio=HQ // HKV, db_path=path, check=False,
                  batch=B)["runs"]["forward"]
    assert fwd["runs"] == "SDPA (default)" and fwd["why"].startswith("host margin")
    assert fwd["host_floor"] == {"time_ms": 0.031, "triton_ms": 0.074}
    assert (fwd["sdpa_ms"], fwd["rocmflash_ms"]) == (0.0982, 0.0977)
    assert incumbent.DECODE_HOST_SLOWDOWN == 2.0  # the factor the messages above were worked out with
