"""benchmarks/scale_sim.py: the scaling model (real scheduler, real items, simulated clock) on a small plan.

The static phase compiles the plan's forward space once (a module-wide compile cache); everything after
that runs on the simulated clock in seconds."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import scale_sim  # noqa: E402

MODEL = {"head_dim": 64, "num_attention_heads": 8, "num_key_value_heads": 8, "max_position_embeddings": 4096,
         "hidden_size": 512}
KEY = "d64-bf16-causal-gqa1-s1024"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A small model (one dtype, two sequence buckets, forward only), a compile cache, and a journal holding
    three configs of the plan's first problem (round 0) and one other problem's records."""
    from rocmflash.config import Problem
    from rocmflash.hw.gpus import get_gpu
    from rocmflash.static.space import default_space

    root = tmp_path_factory.mktemp("scale-sim")
    model = root / "tiny" / "config.json"
    model.parent.mkdir()
    model.write_text(json.dumps(MODEL))
    gpu = get_gpu("h100")
    problem = Problem(head_dim=64, dtype="bf16", causal=True, batch=1, heads_q=8, heads_kv=8, seqlen_q=1024,
                      seqlen_k=1024)
    configs = default_space(gpu).configs(problem, gpu)[:3]
    records = [{"key": KEY, "config": c.to_dict(), "shape": {}, "round": 0, "status": "ok", "median_ms": 0.5,
                "wall_s": w} for c, w in zip(configs, (2.0, 3.0, 4.0))]
    records += [{"key": "d128-fp16-causal-gqa8-s4096", "config": c.to_dict(), "shape": {}, "round": rnd,
                 "status": "ok", "median_ms": 1.0, "wall_s": w}
                for c in configs for rnd, w in ((0, 1.0), (1, 0.5), (2, 0.25), (None, 0.75))]
    journal = root / "journal.jsonl"
    journal.write_text("".join(json.dumps(r) + "\n" for r in records))
    plan = scale_sim.build_plan(str(model), "h100", ["bf16"], [1024, 2048], ("fwd",), decode=False)
    return {"model": str(model), "journal": str(journal), "cache": str(root / "cache"), "plan": plan,
            "records": records}


def test_durations_use_the_recording_then_the_stated_fallbacks(setup):
    d = scale_sim.Durations(setup["records"])
    from rocmflash.config import KernelConfig

    cfg = KernelConfig.from_dict(setup["records"][1]["config"]).to_json()
    assert d.lookup("fwd", (KEY, cfg, 0)) == (3.0, "recorded")
    # round 0 of the forward family: 2, 3, 4 and 1, 1, 1 -> median 1.5
    assert d.lookup("fwd", ("d64-other", cfg, 0)) == (1.5, "family_round_median")
    # no round 3 recorded: the forward family's median of all 15 records (1,1,1,.5,.5,.5,.25,.25,.25,.75 x3, 2,3,4)
    assert d.lookup("fwd", (KEY, cfg, 3)) == (0.75, "family_median")
    from rocmflash.tuning.plan import SECONDS_PER_CONFIG

    assert d.lookup("bwd", ("bwd-x", "{}", None)) == (SECONDS_PER_CONFIG["bwd"], "plan_estimate")


def test_simulate_runs_the_plan_on_the_simulated_clock(setup):
    from rocmflash.tuning.pipeline_exec import makespan

    records = scale_sim.read_journals([setup["journal"]])
    stats, durations, items = scale_sim.simulate_once(setup["plan"], 1, records, setup["cache"], cpu_cores=4,
                                                      stream=False)
    assert [i.key for i in items] == [KEY, "d64-bf16-causal-gqa1-s2048"]
    first, second = stats.items
    # the two buckets share one static phase: charged once, as the compile of 4 cores
    compile_s = [c.observation["compile_seconds"] for c in items[0].static_result.candidates]
    assert first.static_s == pytest.approx(makespan(compile_s, 4)) and first.static_s > 0
    assert second.static_s == 0
    # one worker is never idle once the first static phase is done (the second item is ready by then)
    assert stats.wall_s == pytest.approx(first.static_s + first.timing_s + second.timing_s)
    assert durations.filled["recorded"] == 3 and sum(durations.filled.values()) == first.jobs + second.jobs
    # streamed (the pipeline's default): round 1 starts as the first survivors compile, the same static phase
    streamed, _, _ = scale_sim.simulate_once(setup["plan"], 1, records, setup["cache"], cpu_cores=4)
    assert streamed.items[0].static_s == pytest.approx(first.static_s)
    assert first.static_s + second.timing_s <= streamed.wall_s < stats.wall_s
    lines = scale_sim.simulate(setup["plan"], (1, 2), [setup["journal"]], setup["cache"], cpu_cores=4)
    assert lines[0]["wall_s"] == pytest.approx(streamed.wall_s, abs=0.01) and lines[0]["speedup"] == 1.0
    assert lines[1]["wall_s"] < lines[0]["wall_s"] and lines[1]["speedup"] > 1.2


def test_script_prints_one_json_line_per_worker_count(setup):
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "scale_sim.py"), "--model", setup["model"], "--workers", "1,2",
           "--json", "--cpu-cores", "4", "--dtype", "bf16", "--seqlen", "1024", "--seqlen", "2048", "--pass", "fwd",
           "--no-decode", "--journal", setup["journal"], "--cache-dir", setup["cache"]]
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [line["workers"] for line in lines] == [1, 2]
    assert all({"workers", "wall_s", "speedup", "filled", "jobs"} <= set(line) for line in lines)
    assert lines[0]["speedup"] == 1.0 and lines[1]["speedup"] > 1.2
    assert set(lines[0]["filled"]) == set(scale_sim.FILL_RULES) and lines[0]["filled"]["recorded"] == 3
    # the same plan through the function gives the same figures (the simulation is deterministic)
    again = scale_sim.simulate(setup["plan"], (1, 2), [setup["journal"]], setup["cache"], cpu_cores=4)
    assert [line["wall_s"] for line in again] == [line["wall_s"] for line in lines]


def test_bad_worker_counts_are_a_clear_error(setup, capsys):
    assert scale_sim.main(["--model", setup["model"], "--workers", "1,two"]) == 2
    assert "--workers '1,two' is invalid" in capsys.readouterr().err
    with pytest.raises(ValueError, match="positive counts"):
        scale_sim.simulate(setup["plan"], (0,), [setup["journal"]])


@pytest.mark.parametrize("family", ["bwd", "decode"])
def test_backward_and_decode_items_stream_on_the_simulated_clock(setup, monkeypatch, family):
    """Scheduler "new": a backward or decode problem's first jobs start before its static phase ends (its
    survivors are timeable as their compile-order prefix compiles and their pre-warm batch ends; a backward's dQ
    configs all before its dK/dV configs), so the run ends sooner than unstreamed."""
    from rocmflash.tuning import backward as TB
    from rocmflash.tuning import decode as TD

    full_bwd, full_decode = TB.bwd_space, TD.decode_space
    monkeypatch.setattr(TB, "bwd_space", lambda arch, d: [p for p in full_bwd(arch, d) if p["kernel"] == "dq"][:3]
                        + [p for p in full_bwd(arch, d) if p["kernel"] == "dkdv"][:3])
    monkeypatch.setattr(TD, "decode_space", lambda arch: full_decode(arch)[:4])
    plan = scale_sim.build_plan(setup["model"], "h100", ["bf16"], [1024], ("bwd",) if family == "bwd" else (),
                                decode=family == "decode")
    records = scale_sim.read_journals([setup["journal"]])
    import rocmflash.tuning.pipeline as P

    real, events = P.Pipeline.__init__, []

    def init(self, *a, **kw):  # every step of the run, on the simulated clock
        real(self, *a, **dict(kw, on_event=events.append))

    monkeypatch.setattr(P.Pipeline, "__init__", init)
    runs = {}
    for stream in (False, True):
        events.clear()
        # one core: the compiles arrive one by one, so the pre-warms come in several batches
        stats, _, items = scale_sim.simulate_once(plan, 1, records, setup["cache"], cpu_cores=1, scheduler="new",
                                                  stream=stream)
        item = items[0]
        assert item.family == family and bool(item.stream_prefixes()) is stream
        first_job = min(e["t"] for e in events if e["event"] == "job_start")
        static_done = min(e["t"] for e in events if e["event"] == "static_done")
        assert (first_job < static_done) is stream
        runs[stream] = stats.wall_s
    assert runs[True] < runs[False]
