"""The decode family as a pipeline item: one KV-cache decode problem (``tune --mode decode``).

:class:`DecodeItem` does what the decode tune did for its problem: the static phase, every
survivor pre-warmed at the split counts it is timed at, then timed as one batch of worker tasks
(gated, then timed at each split count), each result journaled as it arrives, and the entry of
:func:`measured_entry`. Once the winner is known, one more job on the same
timing worker times the platform's SDPA beside it (:func:`measure_incumbent`; a dense 16-bit cache only, as
the forward's incumbent job does) and the entry carries its ``incumbent`` field. Its static phase streams: each
certain survivor is timed as its compile arrives (:meth:`~rocmflash.tuning.items_tasks.TaskItem.static_stream`).
"""

from __future__ import annotations

import logging
import time
from typing import Optional

from rocmflash.static.families import FamilyStatic
from rocmflash.tuning.items_tasks import TaskItem
from rocmflash.tuning.spec import NEAR_BEST_PCT


#: estimated timing-worker seconds of one decode item (:meth:`DecodeItem.work_s`): the 2-GPU H200 run of
#: 2026-11-26 (llama-3-8b bf16, batch 32) timed 50 configs in 7-11 s at 2k and 8k cached tokens
DECODE_WORK_S = 9.0

_log = logging.getLogger("rocmflash.tuning.items_decode")

#: the payload tag of the incumbent's job
INCUMBENT = "incumbent"


def measure_incumbent(task: dict) -> dict:
    """Worker side of the incumbent job: :func:`rocmflash.tuning.incumbent_worker.measure_decode` of
    ``task["problem"]`` served by the winner ``task["config"]``, beside SDPA's ``task["backends"]`` (module level:
    a timing worker runs it)."""
    from rocmflash.tuning.incumbent_worker import measure_decode

    return measure_decode(task["problem"], task["config"], task.get("backends"))


class DecodeItem(TaskItem):
    """One decode problem of a tune (see the module docstring)."""

    family = "decode"
    compile_family = "decode"

    def __init__(self, ctx, problem, cache_dir=None, workers=None, timeout_s: float = 120.0,
                 configs: Optional[list] = None, on_result=None, incumbent: bool = True):
        self.cache_dir, self.workers, self.configs = cache_dir, workers, configs
        self.incumbent = incumbent  #: time the platform's SDPA beside the winner (``--no-incumbent``: not)
        self._incumbent: Optional[dict] = None
        super().__init__(ctx, problem.key(), problem, timeout_s, on_result)
        #: the buckets of one compile-only problem share its static phase: the pipeline runs them one at a time,
        #: and the second finds every observation in the compile cache
        self.static_group = ("decode", tuple(sorted(self.compile_problem().items())))

    def compile_problem(self) -> dict:
        """The compile-only problem the static phase builds (:meth:`DecodeProblem.static_problem`)."""
        return self.problem.static_problem().to_dict()

    def work_s(self) -> float:
        """Estimated timing-worker seconds (:data:`DECODE_WORK_S`), for the order of a plan on several workers."""
        return DECODE_WORK_S

    def worker_functions(self) -> tuple:
        from rocmflash.tuning.decode import measure_decode, prewarm_decode

        return measure_decode, prewarm_decode

    def build_static(self, **hooks):
        from rocmflash.tuning.decode import static_phase

        return static_phase(self.ctx.gpu, self.problem, self.cache_dir, self.workers, configs=self.configs, **hooks)

    def stream_rules(self) -> dict:
        """Every survivor is timed (:meth:`to_time`): the streamed ones, and a "kept anyway" config once every
        config is compiled (the static phase prunes with the default settings)."""
        from rocmflash.static.prune import PruneSettings

        return {"settings": PruneSettings(), "settle": True}

    def to_time(self) -> list:
        return [r["config"] for r in self.static_result.ranked]  # every survivor: no ranking decides alone

    def warm_task(self, task: dict) -> dict:
        """A pre-warm task: the split counts the timing worker will launch the config at."""
        from rocmflash.kernels.decode.host import DecodeConfig
        from rocmflash.tuning.decode import split_choices

        return dict(task, splits=split_choices(self.problem, DecodeConfig.from_dict(task["config"]),
                                               compute_units(self.ctx.gpu)))

    def incumbent_job(self):
        """SDPA timed beside the winner on a timing worker; None where it does not apply: ``--no-incumbent``,
        workers that run no tasks, no winner, a paged or fp8 cache (SDPA serves neither)."""
        from rocmflash.api import incumbent
        from rocmflash.tuning.incumbents import TIMEOUT_S

        p = self.problem
        if not (self.incumbent and self.ctx.measuring and self.ctx.runs_tasks) or p.page_size or p.kv_dtype:
            return None
        best = self.measured_entry(self.timing.results()).get("best")
        if not best:
            return None
        self.ctx.out.note(f"{self.key}: timing the platform's SDPA backends beside the winner")
        task = {"problem": self.problem_dict, "config": best, "backends": incumbent.candidates()}  # the tune's side

        return self.worker_task_job(measure_incumbent, task, TIMEOUT_S, INCUMBENT)

    def record(self, job, result: dict) -> None:
        """Journal one config's result; the incumbent's goes to the entry only (a failure is logged, no field)."""
        if job.payload != INCUMBENT:
            super().record(job, result)
            return
        from rocmflash.api.incumbent import decode_field

        if result.get("status") == "ok":
            self._incumbent = decode_field(result)
        else:  # the entry is written all the same; say why it has no incumbent (also without a console)
            why = f"{self.key}: no incumbent in the entry: SDPA's timing {result.get('status')}: {result.get('error')}"
            _log.warning(why)
            self.ctx.out.note(why)

    def measured_entry(self, results: list) -> dict:
        entry = measured_entry(self.ctx.gpu, self.problem, self.static_result, results, self.ctx.env,
                               self.ctx.interpret)
        if self._incumbent is not None and entry.get("best"):
            entry["incumbent"] = self._incumbent
        return entry

    def static_entry(self) -> dict:
        return static_entry(self.problem, self.static_result, self.ctx.why, self.ctx.env)

    def stored(self) -> None:
        from rocmflash.api.decode import clear_cache
        from rocmflash.db.lookups.decode import lookup_decode

        lookup_decode.cache_clear()
        clear_cache()


def measured_entry(gpu, problem, static: FamilyStatic, results: list, env: dict,
                   interpret: bool) -> dict:
    """The database entry of a measured decode problem: the fastest correct config at its best split count,
    its time, K/V read rate and HBM fraction, near-best alternatives and counts."""
    timed = [(t, int(n), r["config"]) for r in results if r["status"] == "ok" for n, t in r["times_ms"].items()]
    counts = {"space": len(static.rows), "survivors": len(static.ranked), "timed": len(results),
              **{s: sum(1 for r in results if r["status"] == s) for s in ("ok", "incorrect", "failed", "timeout",
                                                                         "crashed")}}
    entry = {"mode": "decode", "problem": problem.to_dict(), "measured": bool(timed), "strategy": "all-survivors",
             "counts": counts, "timing": "interpreter" if interpret else "gpu graph replay (cold K/V copies)",
             "fingerprint": env,
             "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if not timed:
        entry.update(best=None, time_ms=None)
        return entry
    timed.sort(key=lambda x: x[0])
    best_t, best_n, best_cfg = timed[0]
    gbs = problem.kv_bytes() / (best_t * 1e-3) / 1e9
    entry.update(best=dict(best_cfg, num_splits=best_n), time_ms=round(best_t, 5), kv_gbs=round(gbs, 1),
                 hbm_efficiency=round(gbs / (gpu.hbm_tbs * 1e3), 3),
                 near_best=[dict(c, num_splits=n, time_ms=round(t, 5)) for t, n, c in timed[1:]
                            if t <= best_t * (1 + NEAR_BEST_PCT / 100)][:10])
    return entry


def static_entry(problem, static: FamilyStatic, why: str, env: dict) -> dict:
    """The static #1, ``"measured": false`` and ``num_splits`` 0 (chosen per call): never served."""
    top = static.ranked[0]["config"] if static.ranked else None
    return {"mode": "decode", "problem": problem.to_dict(), "measured": False, "why_unmeasured": why,
            "strategy": "static", "best": dict(top, num_splits=0) if top else None, "time_ms": None,
            "counts": {"space": len(static.rows), "survivors": len(static.ranked), "timed": 0},
            "fingerprint": env, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def compute_units(gpu) -> int:
    """The CU count split choices are made for: the live device's, else (a cluster's driver, a simulation)
    the catalog's for the GPU tuned."""
    import torch

    from rocmflash.kernels.common import num_compute_units

    return num_compute_units(torch.device("cuda")) if torch.cuda.is_available() else gpu.compute_units


__all__ = ["DecodeItem", "compute_units", "measured_entry", "static_entry"]
