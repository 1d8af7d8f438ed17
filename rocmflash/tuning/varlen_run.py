"""The varlen tunes end to end: static phase, live phase on a matching GPU, database entry, summary.

Kept apart from :mod:`rocmflash.tuning.varlen` / :mod:`rocmflash.tuning.varlen_bwd` (problem,
keys, space, compile entries, run-time lookups) and :mod:`rocmflash.tuning.varlen_worker` /
:mod:`rocmflash.tuning.varlen_bwd_worker` (what a timing worker runs) so the orchestration reads
on its own. It follows :mod:`rocmflash.tuning.decode_run`: every static survivor is timed (one
packed batch is cheap to time), plus the config ``flash_attn_varlen_func`` served before (for
the forward the dense entry or per-arch default, for the backward the dense ``bwd-`` entry or
per-arch default), so each entry says what tuning the varlen kernels on their own gained.
:func:`tune_varlen` tunes the forward (``--pass fwd``), :func:`tune_varlen_backward` the
backward's dQ and dK/dV kernels (``--pass bwd``).
"""

from __future__ import annotations

import time
from typing import Optional

from rocmflash.families import FamilyStatic, FamilyTuneResult, timed_line
from rocmflash.tuning.spec import NEAR_BEST_PCT
from rocmflash.tuning.varlen import VarlenProblem, config_label, static_phase

#: result statuses counted in an entry
STATUSES = ("ok", "incorrect", "failed", "timeout", "crashed")


def dense_choice(gpu, problem: VarlenProblem) -> dict:
    """What ``flash_attn_varlen_func`` ran on ``gpu`` without a varlen entry: the measured dense entry of
    the longest sequence's bucket (online variant), else the per-arch default. ``{"config", "source"}``."""
    from rocmflash import db
    from rocmflash.config import default_config

    match = db.lookup_match(gpu.name, problem.head_dim, problem.dtype, problem.causal, problem.group,
                            problem.max_seqlen, variant="online", measured_only=True)
    if match is not None:
        return {"config": match.config.to_dict(), "source": f"dense entry {match.key}"}
    return {"config": default_config(gpu.arch, problem.head_dim).to_dict(), "source": f"per-arch default ({gpu.arch})"}


def _measure_all(configs: list, problem: VarlenProblem, timeout_s: float, interpret: bool, on_result=None,
                 backward: bool = False) -> list:
    """Every config in one isolated worker pinned to the current device (a crash or hang costs that config);
    on a GPU every config is compiled first, in parallel. ``backward``: the configs are backward space
    points, run by :mod:`rocmflash.tuning.varlen_bwd_worker`."""
    from rocmflash.tuning.isolated import measure_isolated, prewarm_parallel

    if backward:
        from rocmflash.tuning.varlen_bwd_worker import measure_varlen_bwd as measure
        from rocmflash.tuning.varlen_bwd_worker import prewarm_varlen_bwd as prewarm
    else:
        from rocmflash.tuning.varlen_worker import measure_varlen as measure
        from rocmflash.tuning.varlen_worker import prewarm_varlen as prewarm
    tasks = [{"config": c, "problem": problem.to_dict()} for c in configs]
    if not interpret:
        prewarm_parallel(tasks, prewarm, timeout_s)
    return measure_isolated(tasks, measure, timeout_s, interpret, on_result)


def _stamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def measured_entry(problem: VarlenProblem, static: FamilyStatic, results: list, baseline: dict, env: dict,
                   interpret: bool) -> dict:
    """The entry of a live tune: the fastest config that passed the gate, its time and TFLOP/s, near-best
    alternatives, the baseline's time (``speedup_vs_baseline``) and counts. ``measured`` is false (never
    served) when nothing passed."""
    ok = sorted((r for r in results if r["status"] == "ok"), key=lambda r: r["time_ms"])
    counts = {"space": len(static.rows), "survivors": len(static.ranked), "timed": len(results),
              **{s: sum(1 for r in results if r["status"] == s) for s in STATUSES}}
    entry = {"mode": "varlen", "problem": problem.to_dict(), "measured": bool(ok), "strategy": "all-survivors",
             "counts": counts, "timing": "interpreter" if interpret else "gpu (L2 flushed, median)",
             "fingerprint": env, "when": _stamp()}
    if not ok:
        entry.update(best=None, time_ms=None, why_unmeasured="no timed config passed the fp32 gate")
        return entry
    best = ok[0]
    entry.update(best=best["config"], time_ms=round(best["time_ms"], 5), tflops=round(best["tflops"], 2),
                 near_best=[{"config": r["config"], "time_ms": round(r["time_ms"], 5)} for r in ok[1:]
                            if r["time_ms"] <= best["time_ms"] * (1 + NEAR_BEST_PCT / 100)][:10])
    base = next((r for r in results if r["config"] == baseline["config"]), None)
    entry["baseline"] = dict(baseline, status=base["status"] if base else None,
                             time_ms=round(base["time_ms"], 5) if base and base["status"] == "ok" else None)
    if entry["baseline"]["time_ms"]:
        entry["speedup_vs_baseline"] = round(entry["baseline"]["time_ms"] / entry["time_ms"], 3)
    return entry


def static_entry(problem: VarlenProblem, static: FamilyStatic, why: str, env: dict) -> dict:
    """The static #1, ``"measured": false``: a record of the ranking, never served at run time."""
    top = static.ranked[0] if static.ranked else None
    return {"mode": "varlen", "problem": problem.to_dict(), "measured": False, "why_unmeasured": why,
            "strategy": "static", "best": top["config"] if top else None, "time_ms": None,
            "counts": {"space": len(static.rows), "survivors": len(static.ranked), "timed": 0},
            "fingerprint": env, "when": _stamp()}


def tune_varlen(gpu_name: str, problem: VarlenProblem, db_path: Optional[str] = None, cache_dir=None,
                workers=None, timeout_s: float = 120.0, on_result=None,
                configs: Optional[list] = None) -> FamilyTuneResult:
    """Static phase for ``gpu_name``'s arch; on a matching live GPU every survivor (and the baseline) is
    gated and timed; the entry is written to the database (atomically, under the tune lock) and the
    run-time caches of this process are cleared. ``configs`` replaces the default space."""
    def measure(gpu, static, env, interpret):
        baseline = dense_choice(gpu, problem)
        timed = [r["config"] for r in static.ranked]
        if baseline["config"] not in timed:
            timed.append(baseline["config"])
        results = _measure_all(timed, problem, timeout_s, interpret, on_result)
        return results, measured_entry(problem, static, results, baseline, env, interpret)

    return _tune_family(gpu_name, problem, VarlenProblem.key, db_path,
                        lambda gpu: static_phase(gpu, problem, cache_dir, workers, configs=configs), measure,
                        lambda static, why, env: static_entry(problem, static, why, env))


def _tune_family(gpu_name: str, problem: VarlenProblem, key_of, db_path: Optional[str], run_static, measure,
                 unmeasured) -> FamilyTuneResult:
    """What both varlen tunes do around their own steps: validate, resolve the GPU, ``run_static(gpu)``; on a
    matching live GPU ``measure(gpu, static, env, interpret) -> (results, entry)``, else
    ``unmeasured(static, why, env) -> entry``; store the entry under ``key_of(problem)`` (atomically, under
    the tune lock) and clear this process's run-time caches so the new entry serves from the next call."""
    from rocmflash import selection
    from rocmflash.db import default_db_path, environment, store_entry
    from rocmflash.kernels.common import interpreting
    from rocmflash.tuning.run import _no_live_reason, resolve_gpu

    start = time.perf_counter()
    problem.validate()
    key = key_of(problem)
    gpu, live = resolve_gpu(gpu_name)
    static = run_static(gpu)
    measuring = live is not None and live.name == gpu.name
    results, why = [], None
    if measuring:
        import torch

        env = environment(torch.cuda.get_device_properties(torch.cuda.current_device()).name)
        results, entry = measure(gpu, static, env, interpreting())
    else:
        env = environment(None)
        why = _no_live_reason(gpu)
        entry = unmeasured(static, why, env)
    path = db_path or default_db_path(gpu.name)
    store_entry(path, gpu, env, key, entry, measuring)
    selection.clear_cache()  # also forgets the varlen lookups' answers
    return FamilyTuneResult(gpu, problem, static, key, entry, path, measuring, why, results,
                            time.perf_counter() - start)


def print_varlen_summary(result: FamilyTuneResult, console) -> None:
    e, s, p = result.entry, result.static, result.problem
    console.print(f"varlen tune {result.gpu.name} ({result.gpu.arch}) {result.key}: {len(p.lengths)} sequences "
                  f"of {min(p.lengths)}..{p.max_seqlen} tokens; {len(s.rows)} configs, {len(s.ranked)} survive "
                  "the static phase")
    if result.measured:
        c = e["counts"]
        console.print(timed_line(c))
        if e.get("best"):
            console.print(f"best: {config_label(e['best'])}  {e['time_ms']:.3f} ms, {e['tflops']:.1f} TFLOP/s")
            base = e["baseline"]
            if e.get("speedup_vs_baseline"):
                console.print(f"before: {base['source']} {base['time_ms']:.3f} ms ({e['speedup_vs_baseline']:.2f}x)")
        if e.get("timing") == "interpreter":
            console.print("(timed in Triton's CPU interpreter: recorded, never served at run time)")
    else:
        console.print(f"not measured ({result.why_unmeasured}); static #1 written with \"measured\": false: "
                      f"{config_label(e['best']) if e.get('best') else None}")
    console.print(f"database: {result.db_path}")


# ----------------------------------------------------------------------------- the backward
def backward_baseline(gpu, problem: VarlenProblem) -> dict:
    """What ``flash_attn_varlen_func``'s backward ran on ``gpu`` without a ``varlen-bwd-`` entry, as
    :func:`rocmflash.selection.select_varlen_bwd_config` chooses it: the measured dense ``bwd-`` entry of the
    longest sequence's bucket (each kernel that does not build as the varlen kernel replaced by the per-arch
    default's), else the per-arch default. ``{"config": {"dq", "dkdv"}: space points, "source"}``."""
    from rocmflash.kernels.backward import default_bwd_config
    from rocmflash.tuning.backward import lookup_bwd, space_point
    from rocmflash.tuning.varlen_bwd import build_problem, usable_config

    default = default_bwd_config(gpu.arch, problem.head_dim)
    match = lookup_bwd(gpu.name, problem.head_dim, problem.dtype, problem.causal, problem.group, problem.max_seqlen)
    cfg, source = default, f"per-arch default ({gpu.arch})"
    if match is not None:
        cfg, replaced = usable_config(gpu.name, match.config, default,
                                      build_problem(problem.head_dim, problem.dtype, problem.group, problem.causal))
        source = f"dense entry {match.key}" + "".join(f" ({k}: per-arch default, {why})" for k, why in replaced.items())
    return {"config": {k: space_point(k, getattr(cfg, k)) for k in ("dq", "dkdv")}, "source": source}


def _varlen_bwd_entry(entry: dict, baseline: Optional[dict] = None) -> dict:
    """A dense backward entry (:mod:`rocmflash.tuning.backward_run`) made a varlen one: ``"mode": "varlen"``,
    ``"pass": "bwd"``, the forward varlen entry's timing text, and the served-before config as ``baseline``."""
    entry.update(mode="varlen", **{"pass": "bwd"})
    if entry.get("timing") == "gpu":
        entry["timing"] = "gpu (L2 flushed, median)"
    if baseline is not None:
        entry["baseline"] = {"source": baseline["source"], "config": baseline["config"],
                             "time_ms": entry.pop("default_time_ms", None)}
        speedup = entry.pop("speedup_vs_default", None)
        if speedup is not None:
            entry["speedup_vs_baseline"] = speedup
    return entry


def tune_varlen_backward(gpu_name: str, problem: VarlenProblem, db_path: Optional[str] = None, cache_dir=None,
                         workers=None, timeout_s: float = 120.0, on_result=None,
                         configs: Optional[list] = None) -> FamilyTuneResult:
    """The varlen backward tune (:mod:`rocmflash.tuning.varlen_bwd`): static phase for ``gpu_name``'s arch; on
    a matching live GPU every dQ and dK/dV survivor and the baseline (:func:`backward_baseline`) are gated
    and timed and each kernel's fastest correct config stored; else the static #1 of each, unmeasured. The
    entry goes to the database under the tune lock and this process's run-time caches are cleared.
    ``configs`` (backward space points) replaces the default space."""
    from rocmflash.tuning import backward_run
    from rocmflash.tuning.varlen_bwd import problem_key
    from rocmflash.tuning.varlen_bwd import static_phase as bwd_static_phase

    def measure(gpu, static, env, interpret):
        baseline = backward_baseline(gpu, problem)
        timed = backward_run.to_time(static, "race", None, baseline["config"])  # every survivor + the baseline
        results = _measure_all(timed, problem, timeout_s, interpret, on_result, backward=True)
        return results, _varlen_bwd_entry(backward_run.measured_entry(problem, static, results, baseline["config"],
                                                                      "all-survivors", env, interpret), baseline)

    return _tune_family(gpu_name, problem, problem_key, db_path,
                        lambda gpu: bwd_static_phase(gpu, problem, cache_dir, workers, configs=configs), measure,
                        lambda static, why, env: _varlen_bwd_entry(backward_run.static_entry(problem, static, why,
                                                                                              env)))


def print_varlen_bwd_summary(result: FamilyTuneResult, console) -> None:
    from rocmflash.bwd_report import label

    e, s, p = result.entry, result.static, result.problem
    console.print(f"varlen backward tune {result.gpu.name} ({result.gpu.arch}) {result.key}: {len(p.lengths)} "
                  f"sequences of {min(p.lengths)}..{p.max_seqlen} tokens")
    console.print(f"{len(s.rows)} configs (dQ {len(s.of('dq'))}, dK/dV {len(s.of('dkdv'))}), {len(s.ranked('dq'))} "
                  f"dQ and {len(s.ranked('dkdv'))} dK/dV survive the static phase")
    if result.measured:
        c = e["counts"]
        console.print(timed_line(c))
        if e.get("measured"):
            b, t = e["best"], e["time_ms"]
            console.print(f"best: dQ {label(dict(b['dq'], kernel='dq'))} {t['dq']:.3f} ms + dK/dV "
                          f"{label(dict(b['dkdv'], kernel='dkdv'))} {t['dkdv']:.3f} ms = {t['total']:.3f} ms")
            base = e["baseline"]
            if e.get("speedup_vs_baseline"):
                console.print(f"before: {base['source']} {base['time_ms']['total']:.3f} ms "
                              f"({e['speedup_vs_baseline']:.2f}x)")
            if e.get("timing") == "interpreter":
                console.print("(timed in Triton's CPU interpreter: recorded, never served at run time)")
        else:
            console.print(f"not measured: {e.get('why_unmeasured')}")
    else:
        console.print(f"not measured ({result.why_unmeasured}); static #1 of each kernel written with "
                      "\"measured\": false")
    console.print(f"database: {result.db_path}")


__all__ = ["tune_varlen", "print_varlen_summary", "measured_entry", "static_entry", "dense_choice",
           "tune_varlen_backward", "print_varlen_bwd_summary", "backward_baseline"]
