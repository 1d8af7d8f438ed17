"""Short dense problems and the platform's SDPA: the worker's eager measurement (``measure_eager``: forward and
forward+backward through the public call, both sides forced in the dispatch plan), ``rocmflash db refresh-incumbents
--small``'s entry writing on a fake timing function, and run-time dispatch from such an entry -- in Triton's
interpreter (CPU)."""

import os

import pytest
import torch

from rocmflash.api import attention as A
from rocmflash.api import incumbent, ops, selection
from rocmflash.kernels.launch import observe_launches
from varlen_reference import attention_fp64, rel_err

pytestmark = pytest.mark.usefixtures("fresh_selection")

CFG = {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 2, "num_stages": 1}


def _bench():
    from rocmflash.cli import db

    return db


def test_measure_eager_gates_both_sides_and_leaves_no_forced_plan(interpret, monkeypatch, sdpa_spy):
    """The Triton route and each backend are the public call (gated against fp32 here, not timed on the CPU); the
    switch set outside is restored and no kept plan (ops' or the API's) keeps a forced side."""
    from rocmflash.tuning.incumbent_worker import _dense_inputs, _dense_route, measure_eager

    monkeypatch.setenv(selection.NO_INCUMBENT_ENV, "1")
    problem = {"batch": 1, "heads_q": 8, "heads_kv": 2, "seqlen": 24, "head_dim": 32, "dtype": "fp16", "causal": True}
    with observe_launches() as seen:
        res = measure_eager(problem, ["default"])
    assert res["status"] == "ok" and res["triton_rel_err"] < 1e-2
    assert seen  # the Triton side ran rocmflash's kernel (SDPA launches are not Triton launches)
    assert sdpa_spy == [("default", True)]  # the SDPA side went through the dispatch, causal (Sq == Sk)
    assert res["backends"]["default"]["status"] == "skipped" and res["backends"]["default"]["rel_err"] < 1e-2
    assert res["triton_ms"] is None and res["triton_train_ms"] is None  # nothing timed in the interpreter
    assert os.environ[selection.NO_INCUMBENT_ENV] == "1" and not ops._CALLS and not A._PLANS
    assert incumbent.eager_field(res)["backend"] is None and "host time included" in incumbent.EAGER_TIMING
    # the training route is one step: forward and gradients of q, k, v (what the timed loop repeats)
    held = list(_dense_inputs(torch, problem, torch.device("cpu")))
    out = _dense_route(held, None, True, True)()
    assert rel_err(out, held[3]) < 1e-2 and held[0].grad is None  # autograd.grad: nothing accumulated


def test_refresh_small_adds_the_missing_short_problems_with_the_served_config():
    bench = _bench()
    problems = bench.small_problems()
    grid = bench.SMALL_GRID
    assert len(problems) == (len(grid["head_dim"]) * len(grid["dtype"]) * len(grid["causal"]) * len(grid["gqa"])
                             * len(grid["seqlen"]))
    key0, p0 = problems[0]
    assert key0 == "d64-bf16-full-gqa1-s16" and p0["heads_kv"] == 8 and p0["batch"] == 1
    entries = {key0: {"best": {}, "measured": True}}  # a tuned entry: never replaced
    measured = []

    def measure(problem):
        measured.append(problem)
        if problem["seqlen"] == 64 and problem["head_dim"] == 128:
            return {"status": "incorrect", "error": "relative error 1", "triton_ms": None}
        short = problem["seqlen"] <= 16  # SDPA wins the shortest ones
        return {"status": "ok", "triton_ms": 0.030 if short else 0.010, "triton_train_ms": 0.300 if short else 0.100,
                "backends": {"default": {"status": "ok", "time_ms": 0.020, "train_ms": 0.200},
                             "cudnn": {"status": "failed", "error": "no"}}}

    notes = []
    stamp = {"when": "2026-11-26T00:00:00Z", "fingerprint": {"device": "test"}}
    new = bench.refresh_small(entries, measure, lambda p: dict(CFG, num_warps=4), stamp, notes.append)
    assert len(measured) == len(problems) - 1 and key0 not in new
    failed = [k for k, p in problems if p["seqlen"] == 64 and p["head_dim"] == 128]
    assert failed and not set(failed) & set(new) and any("not added" in n for n in notes)
    assert len(new) == len(problems) - 1 - len(failed)
    short = new["d64-fp16-causal-gqa4-s16"]
    assert short["best"] == dict(CFG, num_warps=4) and short["measured"] and "served-config" in short["strategy"]
    assert short["problem"] == {"head_dim": 64, "dtype": "fp16", "causal": True, "gqa_ratio": 4, "seqlen_bucket": 16}
    assert short["shape"]["heads_kv"] == 2 and short["when"] == stamp["when"]
    assert short["incumbent"]["timing"] == incumbent.EAGER_TIMING
    assert incumbent.winner(short["incumbent"], False) == "default" and incumbent.winner(short["incumbent"], True) == "default"
    longer = new["d64-fp16-causal-gqa4-s256"]
    assert incumbent.winner(longer["incumbent"], False) is None and incumbent.winner(longer["incumbent"], True) is None


def _small_db(tmp_path, monkeypatch, entries: dict) -> None:
    from rocmflash import db

    monkeypatch.setenv(db.CONFIG_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(db, "shipped_config_dir", lambda: str(tmp_path / "no-shipped"))
    monkeypatch.setattr(selection, "device_identity", lambda device: ("h100", "sm_90"))
    store = db.ConfigDB.open(str(tmp_path / "h100.json"), "h100", "sm_90", {"test": True})
    for key, entry in entries.items():
        store.put(key, entry)
    store.save()


def _qkv(S, seed, grad=False):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, h, S, 32, generator=g).half().requires_grad_(grad) for h in (8, 2, 2)]


def test_a_short_entry_sends_its_bucket_to_sdpa_forward_and_training(interpret, tmp_path, monkeypatch, sdpa_spy):
    """An eager-timed entry at s16 saying SDPA won serves S 8..32 (one bucket away) from SDPA, forward and with
    gradients, with the right answer; S=128 (two buckets away) keeps rocmflash's kernel."""
    bench = _bench()
    wins = {"status": "ok", "triton_ms": 0.03, "triton_train_ms": 0.3,
            "backends": {"default": {"status": "ok", "time_ms": 0.02, "train_ms": 0.2}}}
    problem = {"batch": 1, "heads_q": 8, "heads_kv": 2, "seqlen": 16, "head_dim": 32, "dtype": "fp16", "causal": True}
    entry = bench.small_entry(problem, incumbent.eager_field(wins), dict(CFG, variant="online"),
                              {"when": "2026-11-26T00:00:00Z"})
    _small_db(tmp_path, monkeypatch, {"d32-fp16-causal-gqa4-s16": entry})
    q, k, v = _qkv(24, 1)
    with observe_launches() as seen:
        out = A.attention(q, k, v, causal=True)
    assert sdpa_spy == [("default", True)] and not seen  # no Triton launch
    ref, _ = attention_fp64(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), 32 ** -0.5, causal=True)
    assert rel_err(out[0].transpose(0, 1), ref) < 1e-2
    qg, kg, vg = _qkv(24, 2, grad=True)
    A.attention(qg, kg, vg, causal=True).sum().backward()
    assert sdpa_spy[-1] == ("default", True) and all(t.grad is not None for t in (qg, kg, vg))
    sdpa_spy.clear()
    q, k, v = _qkv(128, 3)
    with observe_launches() as seen:
        A.attention(q, k, v, causal=True)
    assert not sdpa_spy and seen  # too far from the entry: rocmflash's kernel
