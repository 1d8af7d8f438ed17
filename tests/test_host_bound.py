"""Host-bound calls (:mod:`rocmflash.api.host_bound`): a tuned entry's kernel times scaled to the call, against the
eager host floors of a short entry, decide which side serves -- pure logic, and the dispatch plan of calls of one
bucket but different sizes (CPU, no kernel runs)."""

import pytest
import torch

from rocmflash.api import host_bound, incumbent, ops, selection
from rocmflash.config import KernelConfig
from conftest import spy_on_incumbent

pytestmark = pytest.mark.usefixtures("interpret", "fresh_selection")

#: kernel times at the entry's shape (B8 H32 S2048): rocmflash faster forward and forward+backward
TRITON_KERNEL = {"backend": "cudnn", "time_ms": 0.60, "triton_ms": 0.55,
                 "train": {"backend": "cudnn", "time_ms": 2.4, "triton_ms": 2.2}}
#: eager times of a short problem: SDPA's host path is cheaper, a lot cheaper in training
FLOORS = {"backend": "default", "time_ms": 0.026, "triton_ms": 0.031, "timing": incumbent.EAGER_TIMING,
          "train": {"backend": "default", "time_ms": 0.16, "triton_ms": 0.30}}


def test_expected_winner_takes_the_slower_of_host_and_kernel_per_side():
    # host-bound (a tiny share of the entry's work): the floors decide, and the floor's backend serves
    assert host_bound.expected_winner(TRITON_KERNEL, FLOORS, 1e-4) == "default"
    assert host_bound.expected_winner(TRITON_KERNEL["train"], FLOORS["train"], 1e-4) == "default"
    # GPU-bound (the entry's own work): the kernels decide
    assert host_bound.expected_winner(TRITON_KERNEL, FLOORS, 1.0) is None
    assert host_bound.expected_winner(TRITON_KERNEL["train"], FLOORS["train"], 1.0) is None
    # between: training at 1/16 of the work: rocmflash max(0.30, 0.1375) = 0.30 > SDPA max(0.16, 0.15)
    assert host_bound.expected_winner(TRITON_KERNEL["train"], FLOORS["train"], 1 / 16) == "default"
    # SDPA's kernel above its floor: the kernel-timed backend serves
    sdpa_kernel = {"backend": "cudnn", "time_ms": 0.5, "triton_ms": 0.6}
    assert host_bound.expected_winner(sdpa_kernel, FLOORS, 1.0) == "cudnn"
    # no floors, or no times: the entry's own verdict
    assert host_bound.expected_winner(TRITON_KERNEL, None, 1e-4) is None
    assert host_bound.expected_winner(sdpa_kernel, None, 1e-4) == "cudnn"
    assert host_bound.expected_winner({"backend": "cudnn", "time_ms": None, "triton_ms": 1.0}, FLOORS, 1.0) is None


def _db(tmp_path, monkeypatch, with_floors: bool, gqa_floor: int = 2):
    from rocmflash import db

    monkeypatch.setenv(db.CONFIG_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(db, "shipped_config_dir", lambda: str(tmp_path / "no-shipped"))
    monkeypatch.setattr(selection, "device_identity", lambda device: ("h100", "sm_90"))
    store = db.ConfigDB.open(str(tmp_path / "h100.json"), "h100", "sm_90", {"test": True})
    best = KernelConfig(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1).to_dict()
    store.put(db.problem_key(32, "fp16", True, 2, 2048),
              {"best": best, "measured": True, "incumbent": TRITON_KERNEL,
               "shape": {"batch": 8, "heads_q": 32, "heads_kv": 16, "seqlen_q": 2048, "seqlen_k": 2048}})
    if with_floors:
        store.put(db.problem_key(32, "fp16", True, gqa_floor, 16), {"best": best, "measured": True, "incumbent": FLOORS})
    store.save()


def _plan(B, Hq, S):
    q = torch.empty(B, Hq, S, 32, dtype=torch.float16)
    k = torch.empty(B, Hq // 2, S, 32, dtype=torch.float16)
    return ops._call_plan(q, k, True)


def test_one_bucket_small_calls_run_sdpa_large_ones_rocmflash(tmp_path, monkeypatch):
    _db(tmp_path, monkeypatch, with_floors=True)
    small = _plan(1, 2, 1500)  # 1/238 of the entry's work: host-bound
    assert (small.incumbent, small.incumbent_train) == ("default", "default")
    large = _plan(8, 32, 2048)  # the entry's own shape: its kernel times decide
    assert (large.incumbent, large.incumbent_train) == (None, None)
    # the short entry itself decides by its own (eager) times
    short = _plan(1, 2, 16)
    assert (short.incumbent, short.incumbent_train) == ("default", "default")


def test_without_floors_the_entry_decides_and_floors_of_another_gqa_serve(tmp_path, monkeypatch):
    _db(tmp_path, monkeypatch, with_floors=False)
    assert (_plan(1, 2, 1500).incumbent, _plan(1, 2, 1500).incumbent_train) == (None, None)
    selection.clear_cache()
    ops._CALLS.clear()
    (tmp_path / "b").mkdir()
    _db(tmp_path / "b", monkeypatch, with_floors=True, gqa_floor=4)  # floors timed at GQA 4 serve GQA 2
    assert host_bound.host_floors("h100", 32, torch.float16, True, 2)["time_ms"] == FLOORS["time_ms"]
    assert _plan(1, 2, 1500).incumbent_train == "default"


def test_no_incumbent_switch_still_wins(tmp_path, monkeypatch):
    """ROCMFLASH_NO_INCUMBENT is read per call: a host-bound plan that says SDPA still runs rocmflash."""
    _db(tmp_path, monkeypatch, with_floors=True)
    calls = spy_on_incumbent(monkeypatch)
    monkeypatch.setenv(selection.NO_INCUMBENT_ENV, "1")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, 24, 32, generator=g).half() for h in (2, 1, 1))
    from rocmflash import attention

    assert _plan(1, 2, 24).incumbent == "default"  # the plan says SDPA (the short entry, one bucket away) ...
    attention(q, k, v, causal=True)
    assert calls == []  # ... the switch keeps rocmflash
    monkeypatch.delenv(selection.NO_INCUMBENT_ENV)
    attention(q, k, v, causal=True)
    assert calls == ["default"]


def test_explain_shows_the_expected_eager_times_and_agrees_with_the_dispatch(tmp_path, monkeypatch):
    from rocmflash.cli.explain import explain

    _db(tmp_path, monkeypatch, with_floors=True)
    db_path = str(tmp_path / "h100.json")
    small = explain("h100", 32, "fp16", True, 1500, gqa_ratio=2, db_path=db_path, check=False, batch=1, heads=2)
    runs = small["runs"]["forward+backward"]
    assert runs["runs"] == "SDPA (default)" and runs["expected_sdpa_ms"] < runs["expected_rocmflash_ms"]
    assert runs["expected_rocmflash_ms"] == FLOORS["train"]["triton_ms"] and "host floor" in runs["why"]
    assert _plan(1, 2, 1500).incumbent_train == "default"  # what the dispatch runs for the same call
    large = explain("h100", 32, "fp16", True, 2048, gqa_ratio=2, db_path=db_path, check=False, batch=8, heads=32)
    assert large["runs"]["forward"]["runs"] == "rocmflash" and large["runs"]["forward+backward"]["runs"] == "rocmflash"
    with pytest.raises(ValueError, match="--heads 3 is invalid"):
        explain("h100", 32, "fp16", True, 2048, gqa_ratio=2, db_path=db_path, check=False, heads=3)


def test_explain_prints_the_asked_calls_times_not_only_the_entrys(tmp_path, monkeypatch):
    """The entry was timed at B8 H32 S2048; a B1 H2 S1500 call is a sliver of that work: explain gives the asked
    call's expected times (floors where host-bound, the scaled kernel time otherwise) beside the entry's."""
    from rich.console import Console

    from rocmflash.cli.explain import explain, print_explanation

    _db(tmp_path, monkeypatch, with_floors=True)
    db_path = str(tmp_path / "h100.json")
    small = explain("h100", 32, "fp16", True, 1500, gqa_ratio=2, db_path=db_path, check=False, batch=1, heads=2)
    scale = (1 * 2 * 1500 * 1500) / (8 * 32 * 2048 * 2048)
    fwd = small["runs"]["forward"]["asked"]
    assert fwd["shape"] == {"batch": 1, "heads_q": 2, "seqlen_q": 1500, "seqlen_k": 1500}
    assert fwd["scale"] == pytest.approx(scale, rel=1e-4)
    assert (fwd["sdpa_ms"], fwd["rocmflash_ms"]) == (FLOORS["time_ms"], FLOORS["triton_ms"])  # host-bound: floors
    console = Console(width=200, record=True)
    print_explanation(small, console)
    text = console.export_text()
    assert "this call (B1 H2 Sq1500 Sk1500): SDPA 0.026 ms vs rocmflash 0.031 ms" in text
    assert "entry's times: SDPA cudnn 0.6 ms vs rocmflash 0.55 ms" in text
    # no floors: the kernel time scaled to the call, said as such
    (tmp_path / "b").mkdir()
    _db(tmp_path / "b", monkeypatch, with_floors=False)
    bare = explain("h100", 32, "fp16", True, 1024, gqa_ratio=2, db_path=str(tmp_path / "b" / "h100.json"),
                   check=False, batch=4, heads=32)
    asked = bare["runs"]["forward+backward"]["asked"]
    eighth = (4 * 1024 * 1024) / (8 * 2048 * 2048)
    assert asked["rocmflash_ms"] == pytest.approx(TRITON_KERNEL["train"]["triton_ms"] * eighth, rel=1e-3)
    assert asked["sdpa_ms"] == pytest.approx(TRITON_KERNEL["train"]["time_ms"] * eighth, rel=1e-3)
    assert "no host floor" in asked["basis"]
