"""``rocmflash tune``: static phase, live phase, journal, database.

Flow for one tune (one GPU, head dim, dtype, causal flag, one or more sequence lengths):

1. **Static phase** (always): the config space (:func:`rocmflash.space.default_space`)
   is cross-compiled on the CPU (:func:`rocmflash.compile.sweep`, cached) and pruned
   (:func:`rocmflash.prune.prune`). Survivors are ranked by the static score below.
2. **Live phase**, only when the live GPU is the one asked for: the strategy picks the
   configs to time, each is gated and timed in an isolated worker
   (:mod:`rocmflash.live`), every result is appended to the journal as it arrives, and
   the database entry is rebuilt from the journal (:mod:`rocmflash.db`).
3. Without a matching live GPU the static ranking is written with ``"measured": false``
   and the output says that nothing was benchmarked, and why.

Strategies
----------
``race`` (default): every static survivor, in successive rounds (:mod:`rocmflash.race`):
  a short ungated screen of all, then the fastest quarter (and near-ties) measured
  longer with the gate, then the fastest third of those with the full settings. The
  static score orders the work; it never decides alone what is not timed.
``exhaustive``: time every config of the space, in space order, pruned or not (the
  baseline; the static verdicts are still recorded beside each result).
``pruned``: time only the top ``K`` survivors of the static pruner by static score
  (``--top-k``; default 15% of the space, at least 4). If fewer survive, all are timed.

Static score (the ranking when nothing is measured, the order of ``pruned`` and ``race``)
--------------------------------------------------------------------------------
Survivors are sorted by this key, smallest first:

1. the variant's **work factor**: matrix FLOPs relative to ``online`` (``online`` 1,
   ``split_kv`` 1.05 for its partial writes and combine launch, ``split_d`` (c+1)/2
   for c head-dim chunks recomputing QKᵀ, ``two_phase`` 1.5 for its second QKᵀ pass);
2. **rows per warp** ``BLOCK_M / num_warps`` of at least 16 first: the warps of a
   program split its query rows, and fewer than 16 rows per warp leaves the matrix
   instruction's M dimension (16) part empty (on AMD the default space already
   excludes such configs);
3. **occupancy**: waves per SIMD (AMD) or warps per scheduler (NVIDIA), more first;
4. fewer **allocated VGPRs** (registers per thread on NVIDIA): headroom before the
   next cliff;
5. larger ``BLOCK_N`` (fewer loop trips), then more ``num_stages``, then space order.

It uses compiler truth only (the code object's registers and LDS), never a timing.
History: the first version ranked ``min(BLOCK_M, 128)`` (K/V reuse) before occupancy;
on the H100 it missed the ``64x64, 4 warps`` winner of 9 of 16 benchmark problems
(reports/tune-2026-11-21-h100.md), which this key ranks in its top 13.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import os
import sys
import time
from typing import Callable, Optional

from rocmflash.config import KernelConfig, Problem, normalize_dtype
from rocmflash.db import (ConfigDB, Journal, default_db_path, env_id, environment, journal_path, now_iso,
                          problem_key, seqlen_bucket, tune_lock)
from rocmflash.detect import identify_live_device
from rocmflash.gpus import GPU, UnknownGPUError, get_gpu
from rocmflash.live import LiveSettings
from rocmflash.prune import PruneSettings, prune
from rocmflash.race import DEFAULT_ROUNDS as RACE_ROUNDS
from rocmflash.race import advancing, final_round_records
from rocmflash.roofline import Shape, roofline, tflops
from rocmflash.seeds import reference_seeds

STRATEGIES = ("race", "pruned", "exhaustive")
NEAR_BEST_PCT = 3.0
DEFAULT_TOP_K_FRACTION = 0.15
INJECT_ENV = "ROCMFLASH_TUNE_INJECT"
TOKENS_PER_BATCH = 16384  # default batch: 16k tokens (B = 16384 // S), as in reports/
HEADS_TIMES_D = 2048  # default heads: H x D = 2048

STATIC_SCORE_DOC = ("static score (no timing): variant work factor (online 1, split_kv 1.05, split_d (c+1)/2, "
                    "two_phase 1.5), then BLOCK_M/num_warps >= 16 rows per warp first, then occupancy "
                    "(waves/SIMD or warps/scheduler) higher first, then fewer allocated VGPRs/registers, then "
                    "larger BLOCK_N, more num_stages")


class NoLiveGPUError(ValueError):
    """A tune that must measure (``--gpu auto``, ``--strategy exhaustive``) found no usable live GPU."""


# ====================================================================== the request
@dataclasses.dataclass
class TuneSpec:
    gpu: str
    head_dim: int
    dtype: str
    seqlens: list
    causal: bool = False
    batch: Optional[int] = None  #: default 16384 // S (at least 1)
    heads: Optional[int] = None  #: default 2048 // head_dim (at least 1)
    kv_heads: Optional[int] = None  #: default = heads
    strategy: str = "race"
    top_k: Optional[int] = None  #: configs the pruned strategy times
    db_path: Optional[str] = None
    resume: bool = False
    cache_dir: Optional[str] = None
    workers: Optional[int] = None
    variants: Optional[list] = None
    space: object = None  #: a ConfigSpace to use instead of default_space(gpu, variants)
    prune_settings: PruneSettings = PruneSettings()
    live_settings: LiveSettings = LiveSettings()
    inject: dict = dataclasses.field(default_factory=dict)  #: test mode {mode: timed position}
    prewarm: bool = True
    seeds: bool = True  #: always time the AMD-published configs of the GPU's arch (:mod:`rocmflash.seeds`)

    def validate(self) -> "TuneSpec":
        self.dtype = normalize_dtype(self.dtype)
        if type(self.head_dim) is not int or not 16 <= self.head_dim <= 256:
            raise ValueError(f"head dim {self.head_dim!r} is unsupported; expected an int in 16..256")
        if not self.seqlens:
            raise ValueError("give at least one --seqlen")
        for s in self.seqlens:
            if type(s) is not int or s < 1:
                raise ValueError(f"--seqlen {s!r} is invalid; expected a positive int")
        for name in ("batch", "heads", "kv_heads", "top_k"):
            v = getattr(self, name)
            if v is not None and (type(v) is not int or v < 1):
                raise ValueError(f"--{name.replace('_', '-')} {v!r} is invalid; expected a positive int")
        heads = self.heads or max(1, HEADS_TIMES_D // self.head_dim)
        kv = self.kv_heads or heads
        if heads % kv:
            raise ValueError(f"--heads {heads} is not a multiple of --kv-heads {kv}")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"--strategy {self.strategy!r} is unknown; expected one of {', '.join(STRATEGIES)}")
        for mode in self.inject:
            if mode not in ("crash", "hang", "illegal"):
                raise ValueError(f"inject mode {mode!r} is unknown; expected crash, hang or illegal")
        self.seqlens = list(dict.fromkeys(self.seqlens))
        return self

    def shape(self, seqlen: int) -> Shape:
        heads = self.heads or max(1, HEADS_TIMES_D // self.head_dim)
        return Shape(batch=self.batch or max(1, TOKENS_PER_BATCH // seqlen), heads_q=heads,
                     heads_kv=self.kv_heads or heads, seqlen_q=seqlen, seqlen_k=seqlen, head_dim=self.head_dim,
                     dtype=self.dtype, causal=self.causal)


def parse_inject(text: Optional[str]) -> dict:
    """``"crash@1,hang@3"`` -> ``{"crash": 1, "hang": 3}`` (timed positions, 0-based, first problem)."""
    out = {}
    for part in filter(None, (text or "").split(",")):
        mode, _, pos = part.partition("@")
        out[mode.strip()] = int(pos or 0)
    return out


def static_problem(shape: Shape) -> Problem:
    """The compile-only problem of a shape.

    The kernels depend on sequence lengths only through Triton's integer specialisation
    (``% 16 == 0``, ``== 1``), so every S divisible by 16 shares one static sweep (4096).
    """
    def canon(s):
        return 4096 if s % 16 == 0 else s

    return Problem(head_dim=shape.head_dim, dtype=shape.dtype, causal=shape.causal, batch=1,
                   heads_q=shape.heads_q, heads_kv=shape.heads_kv, seqlen_q=canon(shape.seqlen_q),
                   seqlen_k=canon(shape.seqlen_k))


# ====================================================================== static phase
def work_factor(cfg: KernelConfig) -> float:
    if cfg.variant == "split_kv":
        return 1.05
    if cfg.variant == "two_phase":
        return 1.5
    if cfg.variant == "split_d":
        return (cfg.d_chunks + 1) / 2
    return 1.0


def static_key(cfg: KernelConfig, obs: dict, index: int = 0) -> tuple:
    """Sort key of the static score (smaller is better); see the module docstring."""
    k = obs["kernels"][0] if obs.get("kernels") else {}
    return (work_factor(cfg), cfg.BLOCK_M // cfg.num_warps < 16, -(k.get("waves_per_simd") or 0),
            k.get("allocated_vgprs") or k.get("vgpr_count") or 10**6, -cfg.BLOCK_N, -cfg.num_stages, index)


@dataclasses.dataclass
class Candidate:
    config: KernelConfig
    observation: dict
    kept: bool
    reason: Optional[str]
    detail: str
    static_rank: Optional[int] = None  #: 0-based rank among survivors (None: pruned)
    seed: Optional[str] = None  #: the AMD-published reference id this config is (always timed; :mod:`rocmflash.seeds`)

    def summary(self) -> dict:
        k = self.observation["kernels"][0] if self.observation.get("kernels") else {}
        return {"config": self.config.to_dict(), "static_rank": self.static_rank,
                "waves_per_simd": k.get("waves_per_simd"), "allocated_vgprs": k.get("allocated_vgprs"),
                "lds_bytes": (k.get("lds_bytes") or 0) + (k.get("dynamic_lds_bytes") or 0) if k else None}


@dataclasses.dataclass
class StaticResult:
    problem: Problem
    candidates: list  #: every config of the space, space order
    stats: object

    @property
    def ranked(self) -> list:
        """Survivors, best static score first."""
        return sorted((c for c in self.candidates if c.kept), key=lambda c: c.static_rank)


def static_phase(gpu: GPU, problem: Problem, space, cache_dir=None, workers=None,
                 settings: PruneSettings = PruneSettings(), on_result: Optional[Callable] = None,
                 seeds: tuple = ()) -> StaticResult:
    """Compile and prune the space (plus ``seeds``: ``(reference id, config)`` pairs, added when
    the space lacks them) and rank the survivors by the static score."""
    from rocmflash.compile import sweep

    configs = space.configs(problem, gpu)
    seed_of = {}
    for ref_id, cfg in seeds:
        if cfg not in configs:
            configs.append(cfg)
        seed_of.setdefault(configs.index(cfg), ref_id)
    observations, stats = sweep(configs, problem, gpu, cache_dir=cache_dir, workers=workers, on_result=on_result)
    verdicts = prune(observations, settings)
    cands = [Candidate(cfg, obs, v.kept, v.reason, v.detail, seed=seed_of.get(i))
             for i, (cfg, obs, v) in enumerate(zip(configs, observations, verdicts))]
    survivors = sorted((i for i, c in enumerate(cands) if c.kept),
                       key=lambda i: static_key(cands[i].config, cands[i].observation, i))
    for rank, i in enumerate(survivors):
        cands[i].static_rank = rank
    return StaticResult(problem, cands, stats)


def default_top_k(space_size: int) -> int:
    return max(4, math.ceil(DEFAULT_TOP_K_FRACTION * space_size))


def choose(strategy: str, static: StaticResult, top_k: Optional[int]) -> list:
    """The candidates a strategy times, in timing order."""
    if strategy == "exhaustive":
        return list(static.candidates)
    k = top_k or default_top_k(len(static.candidates))
    top = static.ranked[:k]
    return top + [c for c in seeded(static) if c not in top]


def seeded(static: StaticResult) -> list:
    """The seed candidates that compiled (kept or not): every strategy times them."""
    return [c for c in static.candidates if c.seed and c.reason != "compile_failed"]


# ====================================================================== runners
class ReplayRunner:
    """Serves recorded results instead of a GPU (tests, and re-analysis of a device run).

    ``results`` maps ``(shape dict as sorted tuple, config json)`` to a result dict; a
    config with no recording is ``failed``. Build one from a journal (``from_journal``)
    or from a function ``fn(config, shape) -> result`` (``from_function``).
    """

    live = True

    def __init__(self, results: Optional[dict] = None, fn: Optional[Callable] = None, device: str = "replay"):
        self.results = results or {}
        self.fn = fn
        self.device = device
        self.calls: list = []
        self.budgets: list = []  #: the race round budget of each call (None: full settings)

    @staticmethod
    def _key(shape: Shape, cfg: KernelConfig):
        return (tuple(sorted(shape.to_dict().items())), cfg.to_json())

    @classmethod
    def from_function(cls, fn: Callable, device: str = "replay") -> "ReplayRunner":
        return cls(fn=fn, device=device)

    @classmethod
    def from_journal(cls, path: str, device: str = "replay") -> "ReplayRunner":
        import json

        results = {}
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                if isinstance(r, dict) and "config" in r and "shape" in r:
                    shape, cfg = Shape.from_dict(r["shape"]), KernelConfig.from_dict(r["config"])
                    results[cls._key(shape, cfg)] = {k: r.get(k) for k in
                                                     ("status", "median_ms", "times_ms", "tflops", "rel_err", "error")}
        return cls(results, device=device)

    def prewarm(self, configs, shape) -> dict:
        return {}

    def measure(self, cfg: KernelConfig, shape: Shape, inject: Optional[str] = None,
                budget: Optional[dict] = None) -> dict:
        self.calls.append((cfg, shape))
        self.budgets.append(budget)
        if inject == "crash":
            return {"status": "crashed", "error": "worker died (injected crash, replay)"}
        if inject in ("hang", "illegal"):
            return {"status": "timeout" if inject == "hang" else "crashed", "error": f"injected {inject} (replay)"}
        if self.fn is not None:
            takes_budget = len(inspect.signature(self.fn).parameters) >= 3
            result = dict(self.fn(cfg, shape, budget) if takes_budget else self.fn(cfg, shape))
        else:
            result = dict(self.results.get(self._key(shape, cfg)) or
                          {"status": "failed", "error": "no recorded result for this config and shape"})
        if result.get("status") == "ok" and result.get("median_ms") and not result.get("tflops"):
            result["tflops"] = tflops(shape, result["median_ms"])
        return result

    def close(self) -> None:
        pass


# ====================================================================== entries
def _record_label(r: dict) -> str:
    return KernelConfig.from_dict(r["config"]).to_json()


def measured_entry(gpu: GPU, shape: Shape, records: list, static: StaticResult, strategy: str,
                   timed_total: int, complete: bool, env: dict, rounds: Optional[list] = None) -> dict:
    """The database entry of a measured problem. ``records``: the timings the winner is read from
    (a race's last round); ``rounds``: a race's ``{config json: record}`` per round (counts)."""
    ok = sorted((r for r in records if r["status"] == "ok"), key=lambda r: r["median_ms"])
    latest = list(records)
    if rounds is not None:  # each config's furthest round says how it ended
        furthest: dict = {}
        for by_config in rounds:
            furthest.update(by_config)
        latest = list(furthest.values())
    counts = {"space": len(static.candidates), "survivors": sum(c.kept for c in static.candidates),
              "to_time": timed_total, "timed": len(latest)}
    if rounds is not None:
        counts["rounds"] = [len(by_config) for by_config in rounds]
    seeds = [{"id": r["seed"], "config": r["config"], "status": r["status"], "tflops": r.get("tflops"),
              "round": r.get("round"), "reason": r.get("reason")} for r in latest if r.get("seed")]
    for status in ("ok", "incorrect", "failed", "timeout", "crashed"):
        counts[status] = sum(1 for r in latest if r["status"] == status)
    roof = roofline(gpu, shape)
    entry = {"problem": _problem_dict(shape), "shape": shape.to_dict(), "measured": True, "strategy": strategy,
             "complete": complete, "best": None, "tflops": None, "time_ms": None, "near_best": [],
             "near_best_pct": NEAR_BEST_PCT, "best_per_variant": {}, "roofline": roof.to_dict(), "efficiency": None,
             "counts": counts, "when": now_iso(), "fingerprint": env}
    if seeds:
        entry["seeds"] = seeds
    if any(r.get("interpreted") for r in records):
        entry["timing"] = "interpreter"
        entry["note"] = ("timed in Triton's CPU interpreter (TRITON_INTERPRET=1) at a tiny shape: the ranking says "
                         "nothing about GPU speed, and run-time selection ignores this entry")
    if ok:
        best = ok[0]
        entry.update(best=best["config"], tflops=round(best["tflops"], 2), time_ms=round(best["median_ms"], 5),
                     efficiency=round(roof.efficiency(best["median_ms"]), 4),
                     best_static_rank=best.get("static_rank"), best_verdict=best.get("reason") or "kept")
        limit = best["median_ms"] * (1 + NEAR_BEST_PCT / 100)
        entry["near_best"] = [{"config": r["config"], "tflops": round(r["tflops"], 2),
                               "time_ms": round(r["median_ms"], 5)} for r in ok[1:] if r["median_ms"] <= limit]
        for r in ok:
            entry["best_per_variant"].setdefault(r["config"]["variant"], {"config": r["config"],
                                                                          "tflops": round(r["tflops"], 2)})
    else:
        entry["note"] = "no timed config passed: every one failed, crashed, timed out or was incorrect"
    return entry


def static_entry(gpu: GPU, shape: Shape, static: StaticResult, why: str, env: dict) -> dict:
    ranked = static.ranked
    per_variant = {}
    for c in ranked:
        per_variant.setdefault(c.config.variant, {"config": c.config.to_dict(), "tflops": None})
    return {"problem": _problem_dict(shape), "shape": shape.to_dict(), "measured": False, "strategy": "static",
            "complete": True, "best": ranked[0].config.to_dict() if ranked else None, "tflops": None,
            "time_ms": None, "near_best": [], "near_best_pct": NEAR_BEST_PCT, "best_per_variant": per_variant,
            "ranked": [c.summary() for c in ranked[:8]], "roofline": roofline(gpu, shape).to_dict(),
            "efficiency": None,
            "counts": {"space": len(static.candidates), "survivors": len(ranked), "to_time": 0, "timed": 0},
            "seeds": [{"id": c.seed, "config": c.config.to_dict(), "kept": c.kept, "reason": c.reason,
                       "static_rank": c.static_rank} for c in static.candidates if c.seed],
            "note": f"UNMEASURED: static ranking only, nothing was benchmarked ({why}). {STATIC_SCORE_DOC}.",
            "when": now_iso(), "fingerprint": env}


def _problem_dict(shape: Shape) -> dict:
    return {"head_dim": shape.head_dim, "dtype": shape.dtype, "causal": shape.causal,
            "gqa_ratio": shape.heads_q // shape.heads_kv, "seqlen_bucket": seqlen_bucket(shape.seqlen_k)}


def shape_key(shape: Shape) -> str:
    return problem_key(shape.head_dim, shape.dtype, shape.causal, shape.heads_q // shape.heads_kv,
                       seqlen_bucket(shape.seqlen_k))


# ====================================================================== live rounds
@dataclasses.dataclass
class _LiveProblem:
    """What timing one problem needs: runner, journal, output, and where its records go."""

    runner: object
    journal: Journal
    out: "_Output"
    spec: "TuneSpec"
    key: str
    shape: Shape
    eid: str
    inject: dict  #: test mode {mode: timed position}, consumed as positions are reached
    outcome: "ProblemOutcome"

    def results(self, rnd: Optional[int] = None) -> dict:
        """``{config json: latest record}`` of this problem: single-round strategies (``rnd`` None)
        or one race round."""
        shape = self.shape.to_dict()
        out = {}
        for r in self.journal.records:
            if r["key"] == self.key and r.get("shape") == shape and r.get("env") == self.eid \
                    and r.get("round") == rnd:
                out[KernelConfig.from_dict(r["config"]).to_json()] = r
        return out

    def recorded(self, cands: list, rnd: Optional[int] = None) -> list:
        keys = {c.config.to_json() for c in cands}
        return [r for k, r in self.results(rnd).items() if k in keys]


def _measure(ctx: _LiveProblem, cands: list, rnd: Optional[int], budget: Optional[dict], label: str) -> None:
    """Time the candidates that have no record yet (for this round), appending each result to the journal."""
    done = ctx.results(rnd)
    todo = [c for c in cands if c.config.to_json() not in done]
    skipped = len(cands) - len(todo)
    ctx.outcome.skipped += skipped
    if skipped:
        ctx.out.note(f"{label}: {skipped} of {len(cands)} config(s) already in the journal, skipped")
    best = max((r["tflops"] for r in ctx.recorded(cands, rnd) if r["status"] == "ok"), default=None)
    with ctx.out.bar(label, len(cands), skipped, best) as bar:
        for cand in todo:
            pos = ctx.outcome.timed_now
            mode = next((m for m, p in ctx.inject.items() if p == pos), None)
            if mode:
                ctx.inject.pop(mode)
            result = ctx.runner.measure(cand.config, ctx.shape, inject=mode, **({"budget": budget} if budget else {}))
            record = {"key": ctx.key, "shape": ctx.shape.to_dict(), "env": ctx.eid, "config": cand.config.to_dict(),
                      "strategy": ctx.spec.strategy, "static_rank": cand.static_rank,
                      "verdict": "kept" if cand.kept else "pruned", "reason": cand.reason,
                      "when": now_iso(), "injected": mode, "seed": cand.seed}
            if rnd is not None:
                record.update(round=rnd, budget=budget)
            for field in ("status", "median_ms", "times_ms", "tflops", "rel_err", "error", "wall_s",
                          "worker_s", "gate_s", "device_env"):
                record[field] = result.get(field)
            if result.get("interpreted"):  # CPU interpreter timings (CI): never a GPU's
                record.update(interpreted=True, timed_shape=result.get("timed_shape"))
            ctx.journal.append(record)
            ctx.outcome.timed_now += 1
            if record["status"] == "ok" and (best is None or record["tflops"] > best):
                best = record["tflops"]
            bar.advance(best, record)


def _prewarm(ctx: _LiveProblem, cands: list) -> None:
    if ctx.spec.prewarm and cands and hasattr(ctx.runner, "prewarm"):
        with ctx.out.spinner(f"{ctx.key}: compiling {len(cands)} config(s) in parallel"):
            ctx.runner.prewarm([c.config for c in cands], ctx.shape)


def _single_round(ctx: _LiveProblem, chosen: list) -> None:
    """``pruned`` / ``exhaustive``: time the chosen configs once, with the full live settings."""
    done = ctx.results()
    _prewarm(ctx, [c for c in chosen if c.config.to_json() not in done])
    _measure(ctx, chosen, None, None, ctx.key)


def _race(ctx: _LiveProblem, static: "StaticResult") -> None:
    """``race``: every static survivor, successive rounds (:mod:`rocmflash.race`); resumable per round."""
    field = static.ranked + [c for c in seeded(static) if not c.kept]  # pruned seeds are timed too
    done = ctx.results(0)
    _prewarm(ctx, [c for c in field if c.config.to_json() not in done])
    last = len(RACE_ROUNDS) - 1
    for rnd, spec_round in enumerate(RACE_ROUNDS):
        if not field:
            return
        budget = None if rnd == last else spec_round.budget()  # the last round: the full live settings
        _measure(ctx, field, rnd, budget, f"{ctx.key} round {rnd + 1}/{len(RACE_ROUNDS)}")
        if rnd == last:
            return
        results = ctx.results(rnd)
        timings = []
        for c in field:
            r = results.get(c.config.to_json()) or {}
            timings.append((c.config.to_json(), r.get("median_ms") if r.get("status") == "ok" else None))
        keep = set(advancing(timings, spec_round.keep))
        field = [c for c in field if c.config.to_json() in keep]  # static order: deterministic on resume


# ====================================================================== the tune
@dataclasses.dataclass
class ProblemOutcome:
    key: str
    shape: Shape
    entry: dict
    timed_now: int = 0
    skipped: int = 0
    stale: int = 0
    seconds: float = 0.0
    static_seconds: float = 0.0


@dataclasses.dataclass
class TuneResult:
    gpu: GPU
    db_path: str
    journal_path: Optional[str]
    measured: bool
    why_unmeasured: Optional[str]
    outcomes: list
    seconds: float
    interrupted: bool = False


def resolve_gpu(name: str) -> tuple[GPU, Optional[GPU]]:
    """``(gpu to tune, live gpu or None)``; ``auto`` needs a live GPU in the catalog.

    The live GPU counts as the one named when the live device resolves to it, or when the
    device's report fits it equally well (an unnamed 104-CU gfx90a is an MI250 GCD or an MI210).
    """
    match = identify_live_device()
    live = match.gpu if match is not None else None
    if str(name).strip().lower() == "auto":
        if live is None:
            raise NoLiveGPUError(_no_live_reason(None) + "; --gpu auto needs one (or name a GPU: "
                                 "rocmflash gpus lists them)")
        return live, live
    gpu = get_gpu(name)
    if match is not None and gpu.name in match.alternatives:
        return gpu, gpu
    return gpu, live


def _no_live_reason(gpu: Optional[GPU]) -> str:
    try:
        import torch
    except ImportError:  # pragma: no cover
        return "no live GPU (torch is not importable)"
    if not torch.cuda.is_available():
        return "no live GPU on this machine (torch.cuda.is_available() is False)"
    match = identify_live_device()
    if match.gpu is None:
        return f"the live GPU is not in the catalog: {match.describe()}"
    if gpu is not None:
        return f"the live GPU is {match.gpu.name} ({match.describe()}), not {gpu.name}"
    return f"the live GPU is {match.gpu.name}"


def tune(spec: TuneSpec, runner=None, console=None, progress: bool = True) -> TuneResult:
    """Run a tune; see the module docstring. ``runner`` overrides live detection (tests: ReplayRunner)."""
    from rocmflash.space import default_space

    spec.validate()
    start = time.perf_counter()
    if runner is not None and str(spec.gpu).strip().lower() != "auto":
        gpu, live = get_gpu(spec.gpu), None
    else:
        gpu, live = resolve_gpu(spec.gpu)
    own_runner = False
    why = None
    if runner is None:
        if live is not None and live.name == gpu.name:
            from rocmflash.live import LiveRunner

            own_runner = True
            runner = None  # created after the static phase (needs the cache dir)
        else:
            why = _no_live_reason(gpu)
    measuring = runner is not None or own_runner
    if spec.strategy == "exhaustive" and not measuring:
        raise NoLiveGPUError(f"--strategy exhaustive times every config and needs a live {gpu.name}: {why}")
    device_name = None
    if own_runner:
        import torch

        device_name = torch.cuda.get_device_properties(0).name
    elif runner is not None:
        device_name = getattr(runner, "device", "replay")
    env = environment(device_name)
    eid = env_id(env)
    db_path = spec.db_path or default_db_path(gpu.name)
    jpath = journal_path(db_path) if measuring else None
    space = spec.space or default_space(gpu, spec.variants)
    out = _Output(console, progress)
    if own_runner:
        match = identify_live_device()
        if match is not None and match.problem:  # e.g. an unnamed board that fits two targets
            out.note(f"live GPU: {match.describe()}")
    lock = tune_lock(db_path)
    outcomes: list[ProblemOutcome] = []
    interrupted = False
    try:
        db = ConfigDB.open(db_path, gpu.name, gpu.arch, env, gpu.compute_units)
        journal = Journal(jpath, gpu.name) if measuring else None
        if journal is not None and journal.torn_lines:
            out.note(f"journal: ignored {journal.torn_lines} torn line(s) from an interrupted write")
        if spec.resume:
            out.note(f"resuming from {jpath}: {len(journal.records)} recorded result(s)" if journal is not None
                     else "--resume: nothing to resume (nothing is measured without a live GPU)")
        statics: dict = {}
        if own_runner:
            from rocmflash.compile import ObservationCache, default_cache_dir
            from rocmflash.live import LiveRunner

            triton_cache = os.path.join(ObservationCache(spec.cache_dir or default_cache_dir()).root, "live-triton")
            import torch

            # the device identify_live_device() resolved: the current one, pinned in the workers
            runner = LiveRunner(spec.live_settings, triton_cache_dir=triton_cache, prewarm_workers=spec.workers,
                                device_index=torch.cuda.current_device())
        inject = dict(spec.inject)
        for seqlen in spec.seqlens:
            shape = spec.shape(seqlen)
            key = shape_key(shape)
            t0 = time.perf_counter()
            sp = static_problem(shape)
            if sp not in statics:
                statics[sp] = out.static(gpu, sp, space, spec)
            static = statics[sp]
            static_s = time.perf_counter() - t0
            if not measuring:
                entry = static_entry(gpu, shape, static, why, env)
                db.put(key, entry)
                db.save()
                outcomes.append(ProblemOutcome(key, shape, entry, seconds=time.perf_counter() - t0,
                                               static_seconds=static_s))
                continue
            outcome = ProblemOutcome(key, shape, {}, stale=journal.stale(key, shape.to_dict(), eid),
                                     static_seconds=static_s)
            outcomes.append(outcome)
            ctx = _LiveProblem(runner, journal, out, spec, key, shape, eid, inject, outcome)
            chosen = None if spec.strategy == "race" else choose(spec.strategy, static, spec.top_k)
            complete = False
            try:
                if chosen is None:
                    _race(ctx, static)
                else:
                    _single_round(ctx, chosen)
                complete = True
            finally:  # Ctrl-C included: the entry reflects exactly what the journal holds
                if chosen is None:
                    by_round = [ctx.results(rnd) for rnd in range(len(RACE_ROUNDS))]
                    records, rounds = final_round_records(dict(enumerate(by_round)))[1], by_round
                    to_time = len(static.ranked)
                else:
                    records, rounds, to_time = ctx.recorded(chosen), None, len(chosen)
                outcome.entry = measured_entry(gpu, shape, records, static, spec.strategy, to_time, complete, env,
                                               rounds=rounds)
                db.put(key, outcome.entry)
                db.save(env)
                outcome.seconds = time.perf_counter() - t0
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if own_runner and runner is not None:
            runner.close()
        lock.release()
    result = TuneResult(gpu, db_path, jpath, measuring, why, outcomes, time.perf_counter() - start, interrupted)
    if interrupted:
        raise TuneInterrupted(result)
    return result


class TuneInterrupted(KeyboardInterrupt):
    """Ctrl-C during a tune: the journal and database are consistent; ``result`` says what was kept."""

    def __init__(self, result: TuneResult):
        super().__init__("tune interrupted")
        self.result = result


# ====================================================================== console output
class _Output:
    """Rich progress (static sweep bar, timing bar with ETA and best-so-far) or nothing."""

    def __init__(self, console, progress: bool):
        self.console = console
        self.progress = progress and console is not None

    def note(self, text: str) -> None:
        if self.console is not None:
            self.console.print(text, highlight=False)

    def static(self, gpu, problem, space, spec) -> StaticResult:
        seeds = tuple(reference_seeds(gpu, problem, spec.variants)) if spec.seeds else ()
        if seeds:
            self.note(f"seeds: {len(seeds)} AMD-published {gpu.arch} config(s) always timed: "
                      + ", ".join(ref_id for ref_id, _ in seeds))
        n = len(space.configs(problem, gpu)) + len(seeds)
        if not self.progress:
            return static_phase(gpu, problem, space, spec.cache_dir, spec.workers, spec.prune_settings, seeds=seeds)
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(TextColumn(f"[bold]static sweep for {gpu.arch}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=self.console, transient=True) as bar:
            task = bar.add_task("static", total=n)
            st = static_phase(gpu, problem, space, spec.cache_dir, spec.workers, spec.prune_settings,
                              on_result=lambda _: bar.advance(task), seeds=seeds)
        s = st.stats
        kept = sum(c.kept for c in st.candidates)
        self.note(f"static phase D={problem.head_dim} {problem.dtype}{' causal' if problem.causal else ''}: "
                  f"{s.configs} configs ({s.compiled} compiled, {s.cache_hits} cached, {s.failed} failed) in "
                  f"{s.seconds:.1f} s; {kept} survive the pruner")
        return st

    def spinner(self, text: str):
        import contextlib

        if not self.progress:
            return contextlib.nullcontext()
        return self.console.status(text)

    def bar(self, key: str, total: int, done: int, best: Optional[float]):
        return _Bar(self, key, total, done, best)


class _Bar:
    def __init__(self, out: _Output, key: str, total: int, done: int, best):
        self.out, self.key, self.total, self.done, self.best = out, key, total, done, best
        self.progress = None

    def __enter__(self):
        if self.out.progress:
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                                       TimeRemainingColumn)

            self.progress = Progress(TextColumn(f"[bold]{self.key}"), BarColumn(), MofNCompleteColumn(),
                                     TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                                     TextColumn("{task.fields[best]}"), console=self.out.console)
            self.progress.__enter__()
            self.task = self.progress.add_task(self.key, total=self.total, completed=self.done,
                                               best=self._best_text())
        return self

    def _best_text(self) -> str:
        return "best: -" if self.best is None else f"best: {self.best:.1f} TFLOP/s"

    def advance(self, best, record: dict) -> None:
        self.best = best
        if self.progress is not None:
            self.progress.update(self.task, advance=1, best=self._best_text())
            if record["status"] != "ok":
                self.progress.console.print(f"  {record['status']}: {_label(record['config'])}: "
                                            f"{(record.get('error') or '')[:160]}", highlight=False)

    def __exit__(self, *exc):
        if self.progress is not None:
            self.progress.__exit__(*exc)
        return False


def _label(cfg: dict) -> str:
    c = cfg
    parts = [c["variant"], f"{c['BLOCK_M']}x{c['BLOCK_N']}", f"w{c['num_warps']}", f"s{c['num_stages']}"]
    if c.get("waves_per_eu"):
        parts.append(f"wpe{c['waves_per_eu']}")
    if c.get("matrix_instr_nonkdim"):
        parts.append(f"mfma{c['matrix_instr_nonkdim']}")
    if c.get("kpack", 1) != 1:
        parts.append(f"kp{c['kpack']}")
    if c.get("PRE_LOAD_V"):
        parts.append("plv")
    if c["variant"] == "split_d":
        parts.append(f"c{c['d_chunks']}")
    return " ".join(parts)


def print_summary(result: TuneResult, console) -> None:
    """The final table: winners beside their roofline floor and the efficiency reached."""
    from rich.table import Table

    title = f"rocmflash tune: {result.gpu.name} ({result.gpu.arch}) -> {result.db_path}"
    table = Table(title=title)
    for col in ("problem", "B x H", "measured", "best config", "TFLOP/s", "ms", "floor ms (compute / memory)",
                "efficiency", "timed / space"):
        table.add_column(col)
    for o in result.outcomes:
        e = o.entry
        if not e:
            continue
        roof = e["roofline"]
        floor = f"{roof['floor_ms']:.3f} ({roof['compute_ms']:.3f} / {roof['memory_ms']:.3f})"
        counts = e["counts"]
        table.add_row(o.key, f"{o.shape.batch} x {o.shape.heads_q}/{o.shape.heads_kv}",
                      "yes" if e["measured"] else "NO (static rank)",
                      _label(e["best"]) if e.get("best") else "-",
                      f"{e['tflops']:.1f}" if e.get("tflops") else "-",
                      f"{e['time_ms']:.3f}" if e.get("time_ms") else "-", floor,
                      f"{100 * e['efficiency']:.0f}%" if e.get("efficiency") else "-",
                      f"{counts['timed']} / {counts['space']}"
                      + (" (rounds " + " > ".join(map(str, counts["rounds"])) + ")" if counts.get("rounds") else ""))
    console.print(table)
    if not result.measured:
        console.print(f"[bold]Nothing was benchmarked[/bold]: {result.why_unmeasured}. The static ranking was "
                      f"written to {result.db_path} with \"measured\": false.", highlight=False)
    else:
        timed = sum(o.timed_now for o in result.outcomes)
        skipped = sum(o.skipped for o in result.outcomes)
        console.print(f"timed {timed} config(s) this run (race rounds count once each), reused {skipped} "
                      f"from {result.journal_path}; "
                      f"{result.seconds:.1f} s in all", highlight=False)
        stale = sum(o.stale for o in result.outcomes)
        if stale:
            console.print(f"ignored {stale} journal result(s) made under another environment (Triton/torch/device)",
                          highlight=False)


def log(*a) -> None:  # pragma: no cover - debugging aid
    print(*a, file=sys.stderr, flush=True)
