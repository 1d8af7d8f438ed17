"""The backward family as a pipeline item: one problem's dQ and dK/dV configs (``tune --pass bwd``).

:class:`BackwardItem` does per problem what :func:`rocmflash.tuning.backward_run.tune_backward`
did: the static phase (shared by the problems of one static problem), the configs of
:func:`to_time`, pre-warmed on the timing workers' cache, timed
as one batch of worker tasks with every dQ job before the dK/dV jobs (each dQ launch also
writes ``delta``, which the dK/dV configs read), each result journaled as it arrives, and the
entry of :func:`measured_entry` (the default dK/dV at the
head splits run-time selection would give it). A race's static phase streams (:meth:`BackwardItem.static_stream`):
each kernel's certain survivors are timed as their compiles arrive, every dQ config before any dK/dV config.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Optional

from rocmflash.tuning.backward import KERNELS, BwdStatic
from rocmflash.tuning.items_base import FamilyTiming, StreamedTiming


#: estimated timing-worker seconds of one backward item at :data:`WORK_REFERENCE` (:meth:`BackwardItem.work_s`),
#: and how it grows with the problem's work: the 2-GPU H200 run of 2026-11-26 (llama-3-8b bf16) timed 58 configs
#: in 17.3 s at S=2048 and 48.8 s at S=8192 (4x the work of one call: 2.8x the seconds, ~ work ** 0.75). Below
#: the reference a config's fixed costs (the gate, inputs, the worker's round trip) dominate: no less is assumed.
BACKWARD_WORK_S = 17.3
BACKWARD_WORK_EXPONENT = 0.75
#: (batch, query heads, sequence length, head dim) of that S=2048 problem
WORK_REFERENCE = (8, 32, 2048, 128)


class BackwardItem(StreamedTiming):
    """One backward problem of a tune (see the module docstring)."""

    family = "bwd"

    def __init__(self, ctx, spec, shape, on_result=None):
        from rocmflash.db.lookups.backward import bwd_key
        from rocmflash.kernels.backward.host import default_bwd_config, space_point
        from rocmflash.tuning.backward import measure_bwd

        self.ctx, self.spec, self.shape = ctx, spec, shape
        self.key = bwd_key(shape.head_dim, shape.dtype, shape.causal, shape.heads_q // shape.heads_kv, shape.seqlen_k)
        self.problem_dict = shape.to_dict()
        self.default = default_bwd_config(ctx.gpu.arch, spec.head_dim)
        self.defaults = {"dkdv": space_point("dkdv", self.default.dkdv), "dq": space_point("dq", self.default.dq)}
        self.timing = FamilyTiming(self, "bwd", measure_bwd, spec.live_settings.timeout_s, spec.strategy, on_result)
        self.static_result = None
        self.entry: dict = {}
        self.seconds = 0.0
        self._start = None
        #: the problems of one static problem share one static phase (the pipeline runs it once at a time)
        self.static_group = ("bwd", self._static_problem())

    def _static_problem(self):
        from rocmflash.tuning.spec import static_problem

        return dataclasses.replace(static_problem(self.shape), batch=1)

    def work_s(self) -> float:
        """Estimated timing-worker seconds (:data:`BACKWARD_WORK_S` scaled by the work of one call), for the order
        of a plan on several workers."""
        b, h, s, d = WORK_REFERENCE
        work = self.shape.batch * self.shape.heads_q * self.shape.seqlen_q * self.shape.seqlen_k * self.shape.head_dim
        return BACKWARD_WORK_S * max(1.0, work / (b * h * s * s * d)) ** BACKWARD_WORK_EXPONENT

    def static(self) -> None:
        """The backward space compiled and pruned per kernel (shared per static problem), what is timed
        chosen, and pre-warmed on the timing workers."""
        self._static(None)

    def static_stream(self, notify) -> None:
        """:meth:`static`, but (a race this item compiles) each kernel's certain survivors are pre-warmed and made
        ready to time as their compile results arrive (:mod:`rocmflash.tuning.stream`), every dQ config before
        any dK/dV config; ``notify()`` after each batch."""
        self._static(notify)

    def _static(self, notify) -> None:
        from rocmflash.tuning.backward import prewarm_bwd, static_phase
        from rocmflash.tuning.items_base import config_json

        self._start = time.perf_counter()
        spec, ctx = self.spec, self.ctx
        sp = self.static_group[1]
        inputs = self._prewarm_inputs()
        hooks = self._open_stream(notify) if notify is not None else {}
        try:
            self.static_result = ctx.statics.get(self.static_group, lambda: static_phase(
                ctx.gpu, sp, spec.cache_dir, spec.workers, spec.prune_settings, **hooks))
        finally:
            self.timing.close_stream()
            if inputs is not None:
                inputs.join()
        if not ctx.measuring:
            return
        chosen = to_time(self.static_result, spec.strategy, spec.top_k, self.defaults)
        tasks = [{"config": c, "shape": self.problem_dict} for c in chosen]
        # dQ first: each dQ launch also writes delta, which the dK/dV configs read
        tasks.sort(key=lambda t: KERNELS.index(t["config"]["kernel"]))
        self.timing.tasks = tasks
        warmed = self.timing.check_streamed()
        ctx.prewarm_tasks([t for t in self.timing.todo() if config_json(t["config"]) not in warmed], prewarm_bwd,
                          spec.live_settings.timeout_s)

    def _prewarm_inputs(self):
        """Build what every measurement's inputs are made with (the forward and delta, :data:`~rocmflash.tuning.
        backward.INPUTS`) on the pre-warm pool, beside this static phase's cross-compile; the thread (joined when
        the static phase ends), or None where nothing is pre-warmed."""
        import threading

        from rocmflash.tuning.backward import INPUTS, prewarm_bwd

        ctx = self.ctx
        if not (ctx.measuring and self.spec.prewarm and ctx.can_prewarm("prewarm_tasks")):
            return None
        task = {"config": {"kernel": INPUTS}, "shape": self.problem_dict}
        thread = threading.Thread(target=ctx.prewarm_tasks, args=([task], prewarm_bwd,
                                                                  self.spec.live_settings.timeout_s),
                                  daemon=True, name="rocmflash-bwd-inputs-prewarm")
        thread.start()
        return thread

    def _open_stream(self, notify) -> dict:
        """The hooks of a streamed static phase (a measured race, whose field is every survivor and each kernel's
        default): per kernel pruned on its own, dQ released before dK/dV, each default once its kernel is
        wholly compiled unless it survived."""
        from rocmflash.tuning.backward import prewarm_bwd

        ctx, spec = self.ctx, self.spec
        if not (ctx.measuring and spec.strategy == "race"):
            return {}
        timeout_s = spec.live_settings.timeout_s
        prewarm = (lambda tasks: ctx.prewarm_tasks(tasks, prewarm_bwd, timeout_s)) if ctx.can_prewarm("prewarm_tasks") \
            else None
        return self.timing.open_stream(notify, spec.prune_settings, lambda c: {"config": c, "shape": self.problem_dict},
                                       prewarm, group=lambda c: c["kernel"], stages=KERNELS, settle=True,
                                       always=tuple(self.defaults.values()))

    def compile_seconds(self) -> list:
        from rocmflash.tuning.items_base import cached_compile_seconds

        if self.static_result is None:
            return []
        return cached_compile_seconds("backward", [r["config"] for r in self.static_result.rows],
                                      self.static_result.problem.to_dict(), self.ctx.gpu, self.spec.cache_dir)

    def next_batch(self) -> Optional[list]:
        if self.ctx.measuring and not self.timing.handed_out:
            self.ctx.out.note(f"backward {self.key}: timing {len(self.timing.tasks)} dQ and dK/dV configs on the "
                              "live GPU")
        return self.timing.batch()

    def record(self, job, result: dict) -> None:
        self.timing.record(job, result)

    def finish(self, complete: bool) -> None:
        ctx = self.ctx
        if self.static_result is None:
            return
        if ctx.measuring:
            self.entry = measured_entry(self.shape, self.static_result, self.timing.results(), self.defaults,
                                        self.spec.strategy, ctx.env, ctx.interpret,
                                        _auto_splits(self.shape, self.default.dkdv.BLOCK_N, ctx.interpret,
                                                     ctx.gpu.compute_units))
            self.entry["complete"] = complete or not self.timing.todo()  # false: --resume times the rest
        else:
            self.entry = static_entry(self.shape, self.static_result, ctx.why, ctx.env)
        ctx.store(self.key, self.entry, self.spec.cache_dir)
        self.seconds = time.perf_counter() - (self._start or time.perf_counter())

    def outcome(self):
        """Today's :class:`BwdOutcome` of this problem."""
        return BwdOutcome(self.key, self.shape, self.static_result, self.entry, self.timing.results(), self.seconds)


#: results within this many percent of a kernel's best time are listed as near-best
NEAR_BEST_PCT = 3.0


@dataclasses.dataclass
class BwdOutcome:
    key: str
    shape: object
    static: BwdStatic
    entry: dict
    results: list
    seconds: float


def to_time(static: BwdStatic, strategy: str, top_k: Optional[int], defaults: dict) -> list:
    """The space points to measure: every survivor (``race``: the race's guarantee, with no ranking
    needed at this size), every config (``exhaustive``) or the top ``top_k`` survivors per kernel
    (``pruned``); the per-arch default of each kernel always, so the entry says what tuning gained."""
    chosen = []
    for kernel in KERNELS:
        if strategy == "exhaustive":
            rows = [r for r in static.of(kernel) if r["kernel"]]
        else:
            rows = static.ranked(kernel)
            if strategy == "pruned" and top_k:
                rows = rows[:top_k]
        chosen += [r["config"] for r in rows]
        if defaults[kernel] not in chosen:
            chosen.append(defaults[kernel])
    return chosen


def _kernel_best(results: list, kernel: str) -> list:
    """``[(ms, head_splits, config), ...]`` of one kernel's correct results, fastest first."""
    timed = [(t, int(n), r["config"]) for r in results if r["status"] == "ok" and r["config"]["kernel"] == kernel
             for n, t in r["times_ms"].items()]
    return sorted(timed, key=lambda x: x[0])


def measured_entry(shape, static: BwdStatic, results: list, defaults: dict, strategy: str, env: dict,
                   interpret: bool, auto_splits: int = 1) -> dict:
    """The database entry of a measured backward problem: the best of each kernel, its time, the
    default's time (dK/dV at ``auto_splits``, the split count the run time would choose for it),
    near-best alternatives and counts."""
    from rocmflash.tuning.backward import kernel_config

    counts = {"space": len(static.rows), "survivors": sum(len(static.ranked(k)) for k in KERNELS),
              "timed": len(results),
              **{s: sum(1 for r in results if r["status"] == s) for s in ("ok", "incorrect", "failed", "timeout",
                                                                         "crashed")}}
    entry = {"mode": "bwd", "problem": shape.to_dict(), "strategy": strategy, "counts": counts,
             "timing": "interpreter" if interpret else "gpu", "fingerprint": env,
             "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    best = {k: _kernel_best(results, k) for k in KERNELS}
    if not all(best.values()):
        missing = [k for k in KERNELS if not best[k]]
        entry.update(measured=False, best=None, time_ms=None,
                     why_unmeasured=f"no {' or '.join(missing)} config passed the gate")
        return entry
    (t_dq, _, c_dq), (t_dkdv, splits, c_dkdv) = best["dq"][0], best["dkdv"][0]
    entry.update(measured=True, best={"dkdv": kernel_config(c_dkdv).to_dict(), "dq": kernel_config(c_dq).to_dict(),
                                      "head_splits": splits},
                 time_ms={"dq": round(t_dq, 5), "dkdv": round(t_dkdv, 5), "total": round(t_dq + t_dkdv, 5)})
    default_ms = {}
    for kernel in KERNELS:  # the per-arch default as run-time selection runs it (dK/dV: automatic head splits)
        own = {n: t for t, n, c in best[kernel] if c == defaults[kernel]}
        pick = own.get(auto_splits if kernel == "dkdv" else 1, min(own.values()) if own else None)
        default_ms[kernel] = round(pick, 5) if pick is not None else None
    if all(default_ms.values()):
        default_ms["total"] = round(default_ms["dq"] + default_ms["dkdv"], 5)
        entry["speedup_vs_default"] = round(default_ms["total"] / entry["time_ms"]["total"], 3)
    entry["default_time_ms"] = default_ms
    entry["near_best"] = {k: [dict(kernel_config(c).to_dict(), head_splits=n, time_ms=round(t, 5))
                              for t, n, c in best[k][1:] if t <= best[k][0][0] * (1 + NEAR_BEST_PCT / 100)][:5]
                          for k in KERNELS}
    return entry


def static_entry(shape, static: BwdStatic, why: str, env: dict) -> dict:
    """The static #1 of each kernel, ``"measured": false`` (never served at run time)."""
    from rocmflash.tuning.backward import kernel_config

    tops = {k: static.ranked(k) for k in KERNELS}
    best = ({"dkdv": kernel_config(tops["dkdv"][0]["config"]).to_dict(),
             "dq": kernel_config(tops["dq"][0]["config"]).to_dict(), "head_splits": 0}
            if all(tops.values()) else None)
    return {"mode": "bwd", "problem": shape.to_dict(), "measured": False, "why_unmeasured": why, "strategy": "static",
            "best": best, "time_ms": None,
            "counts": {"space": len(static.rows), "survivors": sum(len(v) for v in tops.values()), "timed": 0},
            "fingerprint": env, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def _auto_splits(shape, block_n: int, interpret: bool, compute_units: int = 0) -> int:
    """The head splits run-time selection gives the default dK/dV config on the tuned device (a cluster's
    driver may have no GPU: then the catalog's CU count of the GPU tuned)."""
    import torch

    from rocmflash.kernels.backward.host import choose_head_splits
    from rocmflash.kernels.common import num_compute_units

    if interpret:
        units = num_compute_units(None)
    elif torch.cuda.is_available():
        units = num_compute_units(torch.device("cuda"))
    else:
        units = compute_units
    return choose_head_splits(shape.batch, shape.heads_kv, shape.heads_q // shape.heads_kv, shape.seqlen_k, block_n,
                              units)


def backward_items(ctx, spec, on_result=None) -> list:
    """One :class:`BackwardItem` per sequence length of ``spec`` (a validated TuneSpec)."""
    return [BackwardItem(ctx, spec, spec.shape(s), on_result) for s in spec.seqlens]


__all__ = ["BackwardItem", "BwdOutcome", "backward_items", "to_time", "measured_entry", "static_entry",
           "NEAR_BEST_PCT"]
