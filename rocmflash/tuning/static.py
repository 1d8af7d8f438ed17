"""The static phase of a tune: compile and prune the space, rank the survivors (no GPU, no timing).

The static score is documented in :mod:`rocmflash.tuning` (and ``STATIC_SCORE_DOC``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Optional

from rocmflash.config import KernelConfig, Problem
from rocmflash.static.dedupe import mark_candidates
from rocmflash.hw.gpus import GPU
from rocmflash.static.prune import PruneSettings, prune
from rocmflash.tuning.spec import DEFAULT_TOP_K_FRACTION

def work_factor(cfg: KernelConfig) -> float:
    if cfg.variant == "split_kv":
        return 1.05
    if cfg.variant == "two_phase":
        return 1.5
    if cfg.variant == "split_d":
        return (cfg.d_chunks + 1) / 2
    return 1.0


#: the occupancy a tile must keep on AMD before a larger tile is preferred (AMD's published defaults run at 2)
AMD_TILE_WAVES = 2


def static_key(cfg: KernelConfig, obs: dict, index: int = 0) -> tuple:
    """Sort key of the static score (smaller is better); see :mod:`rocmflash.tuning`.

    NVIDIA: occupancy, then fewer registers, then larger ``BLOCK_N`` (fitted on H100 timings).
    AMD (gfx*): among tiles that keep :data:`AMD_TILE_WAVES` waves/SIMD, larger ``BLOCK_M`` (up
    to 128) then larger ``BLOCK_N`` (up to 64) first, then occupancy and registers (fitted on the
    aiter MI300X/MI350X defaults; ``docs/evidence/reference-2026-11-23/README.md``).
    """
    k = obs["kernels"][0] if obs.get("kernels") else {}
    waves = k.get("waves_per_simd") or 0
    vgprs = k.get("allocated_vgprs") or k.get("vgpr_count") or 10**6
    head = (work_factor(cfg), cfg.BLOCK_M // cfg.num_warps < 16)
    if str(k.get("arch") or obs.get("arch") or "").startswith("gfx"):
        return head + (waves < AMD_TILE_WAVES, -min(cfg.BLOCK_M, 128), -min(cfg.BLOCK_N, 64), -waves, vgprs,
                       -cfg.num_stages, index)
    return head + (-waves, vgprs, -cfg.BLOCK_N, -cfg.num_stages, index)


@dataclasses.dataclass
class Candidate:
    config: KernelConfig
    observation: dict
    kept: bool
    reason: Optional[str]
    detail: str
    static_rank: Optional[int] = None  #: 0-based rank among survivors (None: pruned)
    seed: Optional[str] = None  #: the AMD-published reference id this config is (always timed; :mod:`rocmflash.static.seeds`)
    duplicate_of: Optional[int] = None  #: index of the candidate with the same code object that is timed instead

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


def static_configs(gpu: GPU, problem: Problem, space, seeds: tuple = ()) -> tuple:
    """``(configs, {index: reference id})``: what :func:`static_phase` compiles, in its order (the space, then the
    ``seeds`` it lacks)."""
    configs = space.configs(problem, gpu)
    seed_of = {}
    for ref_id, cfg in seeds:
        if cfg not in configs:
            configs.append(cfg)
        seed_of.setdefault(configs.index(cfg), ref_id)
    return configs, seed_of


def static_phase(gpu: GPU, problem: Problem, space, cache_dir=None, workers=None,
                 settings: PruneSettings = PruneSettings(), on_result: Optional[Callable] = None,
                 seeds: tuple = ()) -> StaticResult:
    """Compile and prune the space (plus ``seeds``: ``(reference id, config)`` pairs, added when
    the space lacks them) and rank the survivors by the static score."""
    from rocmflash.static.compile import sweep

    configs, seed_of = static_configs(gpu, problem, space, seeds)
    observations, stats = sweep(configs, problem, gpu, cache_dir=cache_dir, workers=workers, on_result=on_result)
    verdicts = prune(observations, settings)
    cands = [Candidate(cfg, obs, v.kept, v.reason, v.detail, seed=seed_of.get(i))
             for i, (cfg, obs, v) in enumerate(zip(configs, observations, verdicts))]
    mark_candidates(cands)  # byte-identical binaries: one representative each (rocmflash.static.dedupe)
    survivors = sorted((i for i, c in enumerate(cands) if c.kept),
                       key=lambda i: static_key(cands[i].config, cands[i].observation, i))
    for rank, i in enumerate(survivors):
        cands[i].static_rank = rank
    return StaticResult(problem, cands, stats)


def default_top_k(space_size: int) -> int:
    return max(4, math.ceil(DEFAULT_TOP_K_FRACTION * space_size))
