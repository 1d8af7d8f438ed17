"""The varlen families as pipeline items: one packed batch's forward or backward (``tune --mode varlen``).

As the varlen tunes did: every static survivor is timed (one packed batch is cheap to time),
plus the config ``flash_attn_varlen_func`` served before (the forward: the dense entry or the
per-arch default; the backward: the dense ``bwd-`` entry or the per-arch default), so each
entry says what tuning the varlen kernels on their own gained. The baseline is read when the
static phase ends, as the tunes read it before timing.
"""

from __future__ import annotations

import time
from typing import Optional

from rocmflash.static.families import FamilyStatic
from rocmflash.tuning import items_bwd
from rocmflash.tuning.items_tasks import TaskItem
from rocmflash.tuning.spec import NEAR_BEST_PCT
from rocmflash.tuning.varlen import VarlenProblem


#: the payload tag of the incumbent's job
INCUMBENT = "incumbent"
#: seconds the worker may take for the incumbent (gate + timed calls)
INCUMBENT_TIMEOUT_S = 300.0


def measure_incumbent(task: dict) -> dict:
    """Worker side of the incumbent job (module level: a timing worker runs it)."""
    from rocmflash.tuning.varlen_worker import measure_varlen_incumbent

    return measure_varlen_incumbent(task)


class VarlenItem(TaskItem):
    """The varlen forward of one problem; once its configs are timed, the platform's varlen attention on the same
    timing worker (:mod:`rocmflash.api.varlen_incumbent`; ``incumbent=False``, ``--no-incumbent``: not)."""

    family = "varlen_fwd"
    compile_family = "varlen"

    def __init__(self, ctx, problem, cache_dir=None, workers=None, timeout_s: float = 120.0,
                 configs: Optional[list] = None, on_result=None, incumbent: bool = True):
        self.cache_dir, self.workers, self.configs = cache_dir, workers, configs
        self.baseline = None
        self.incumbent = incumbent
        self._incumbent: Optional[dict] = None
        super().__init__(ctx, problem.key(), problem, timeout_s, on_result)

    def incumbent_job(self):
        """The platform's varlen attention timed on a timing worker beside the winner; None with ``--no-incumbent``,
        on workers that run no tasks, or without a winner."""
        if not (self.incumbent and self.ctx.measuring and self.ctx.runs_tasks):
            return None
        entry = self.measured_entry(self.timing.results())
        if not entry.get("best"):
            return None
        self.ctx.out.note(f"{self.key}: timing the platform's varlen attention beside the winner")
        task = {"problem": self.problem_dict, "config": entry["best"]}
        return self.worker_task_job(measure_incumbent, task, INCUMBENT_TIMEOUT_S, (INCUMBENT, entry["time_ms"]))

    def record(self, job, result: dict) -> None:
        """Journal one config's result; the incumbent's goes to the entry only."""
        if not (isinstance(job.payload, tuple) and job.payload[0] == INCUMBENT):
            super().record(job, result)
            return
        from rocmflash.tuning.incumbents import incumbent_result_field

        self._incumbent = incumbent_result_field(result, job.payload[1])

    def worker_functions(self) -> tuple:
        from rocmflash.tuning.varlen_worker import measure_varlen, prewarm_varlen

        return measure_varlen, prewarm_varlen

    def compile_problem(self) -> dict:
        return self.problem.compile_dict()

    def build_static(self):
        from rocmflash.tuning.varlen import static_phase

        return static_phase(self.ctx.gpu, self.problem, self.cache_dir, self.workers, configs=self.configs)

    def to_time(self) -> list:
        self.baseline = dense_choice(self.ctx.gpu, self.problem)
        timed = [r["config"] for r in self.static_result.ranked]
        return timed + ([self.baseline["config"]] if self.baseline["config"] not in timed else [])

    def measured_entry(self, results: list) -> dict:
        entry = measured_entry(self.problem, self.static_result, results, self.baseline, self.ctx.env,
                               self.ctx.interpret)
        if self._incumbent is not None and entry.get("best"):
            entry["incumbent"] = self._incumbent
        return entry

    def static_entry(self) -> dict:
        return static_entry(self.problem, self.static_result, self.ctx.why, self.ctx.env)


class VarlenBwdItem(TaskItem):
    """The varlen backward (dQ and dK/dV) of one problem."""

    family = "varlen_bwd"
    compile_family = "varlen_bwd"

    def __init__(self, ctx, problem, cache_dir=None, workers=None, timeout_s: float = 120.0,
                 configs: Optional[list] = None, on_result=None):
        from rocmflash.tuning.varlen_bwd import problem_key

        self.cache_dir, self.workers, self.configs = cache_dir, workers, configs
        self.baseline = None
        super().__init__(ctx, problem_key(problem), problem, timeout_s, on_result)

    def worker_functions(self) -> tuple:
        from rocmflash.tuning.varlen_bwd_worker import measure_varlen_bwd, prewarm_varlen_bwd

        return measure_varlen_bwd, prewarm_varlen_bwd

    def compile_problem(self) -> dict:
        return self.problem.compile_dict()

    def build_static(self):
        from rocmflash.tuning.varlen_bwd import static_phase

        return static_phase(self.ctx.gpu, self.problem, self.cache_dir, self.workers, configs=self.configs)

    def to_time(self) -> list:
        self.baseline = backward_baseline(self.ctx.gpu, self.problem)
        # every survivor, and the baseline
        return items_bwd.to_time(self.static_result, "race", None, self.baseline["config"])

    def measured_entry(self, results: list) -> dict:
        return _varlen_bwd_entry(items_bwd.measured_entry(self.problem, self.static_result, results,
                                                          self.baseline["config"], "all-survivors", self.ctx.env,
                                                          self.ctx.interpret), self.baseline)

    def static_entry(self) -> dict:
        return _varlen_bwd_entry(items_bwd.static_entry(self.problem, self.static_result, self.ctx.why,
                                                        self.ctx.env))


# ----------------------------------------------------------------------------- the forward's entries
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


# ----------------------------------------------------------------------------- the backward's entries
def backward_baseline(gpu, problem: VarlenProblem) -> dict:
    """What ``flash_attn_varlen_func``'s backward ran on ``gpu`` without a ``varlen-bwd-`` entry, as
    :func:`rocmflash.api.selection.select_varlen_bwd_config` chooses it: the measured dense ``bwd-`` entry of the
    longest sequence's bucket (each kernel that does not build as the varlen kernel replaced by the per-arch
    default's), else the per-arch default. ``{"config": {"dq", "dkdv"}: space points, "source"}``."""
    from rocmflash.api.build_check import build_problem, usable_config
    from rocmflash.db.lookups.backward import lookup_bwd
    from rocmflash.kernels.backward.host import default_bwd_config, space_point

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


__all__ = ["VarlenItem", "VarlenBwdItem", "dense_choice", "measured_entry", "static_entry", "backward_baseline",
           "STATUSES"]
