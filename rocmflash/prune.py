"""Prune configs on compiler truth, before any GPU time is spent.

Every rule is a pure function of one observation (what :mod:`rocmflash.compile`
read from the code object) and the settings, returning ``None`` to keep or a
sentence explaining the rejection. Rules run in a fixed order and the first that
rejects names the reason:

``compile_failed`` → ``spills`` → ``lds_over_budget`` → ``below_occupancy_floor`` →
``cliff_victim`` → ``duplicate_binary``

The pruner never returns an empty set: if every config is rejected it keeps the
compiled one with the best occupancy and says so (reason ``kept_best_of_pruned``).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

from isa_tools import AMD_ARCHS, NVIDIA_ARCHS, amd_occupancy

REASONS = ("compile_failed", "spills", "lds_over_budget", "below_occupancy_floor", "cliff_victim",
           "duplicate_binary")
KEPT_ANYWAY = "kept_best_of_pruned"


@dataclasses.dataclass(frozen=True)
class PruneSettings:
    """Knobs of the pruner.

    ``occupancy_floor``: fewest waves per SIMD (AMD) or warps per scheduler (NVIDIA) a
    config must reach; None picks 2 on AMD (one wave per SIMD leaves nothing to hide
    memory latency behind in the KV loop) and 1 on NVIDIA. ``cliff_margin``: a config
    whose allocated VGPRs are at most this many past an occupancy cliff, and that would
    gain resident waves by shedding them, is a cliff victim. ``lds_budget``: optional
    cap on LDS/shared bytes per workgroup below the hardware maximum.
    """

    occupancy_floor: Optional[int] = None
    cliff_margin: int = 16
    lds_budget: Optional[int] = None
    allow_spills: bool = False

    def floor_for(self, arch: str) -> int:
        if self.occupancy_floor is not None:
            return self.occupancy_floor
        return 2 if arch in AMD_ARCHS else 1


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Keep or prune, the reason (one of :data:`REASONS`, or None when kept) and a sentence why."""

    kept: bool
    reason: Optional[str]
    detail: str

    @property
    def label(self) -> str:
        return "kept" if self.kept else "pruned"


def _main(obs: dict) -> dict:
    return obs["kernels"][0]


def compile_failed(obs: dict, settings: PruneSettings) -> Optional[str]:
    if obs["status"] != "ok":
        return obs.get("error") or "compile failed"
    return None


def spills(obs: dict, settings: PruneSettings) -> Optional[str]:
    if settings.allow_spills:
        return None
    for kernel in obs["kernels"]:
        v, s, scratch = kernel["vgpr_spill_count"], kernel["sgpr_spill_count"] or 0, kernel["scratch_bytes"]
        if v or s or scratch:
            return f"{kernel['name']}: {v} VGPR and {s} SGPR spills, {scratch} B scratch per lane"
    return None


def _lds_limit(arch: str) -> int:
    if arch in AMD_ARCHS:
        return AMD_ARCHS[arch].max_lds_per_workgroup
    return NVIDIA_ARCHS[arch].max_shared_per_block


def lds_over_budget(obs: dict, settings: PruneSettings) -> Optional[str]:
    for kernel in obs["kernels"]:
        total = kernel["lds_bytes"] + kernel["dynamic_lds_bytes"]
        limit = _lds_limit(kernel["arch"])
        if settings.lds_budget is not None:
            limit = min(limit, settings.lds_budget)
        if total > limit:
            return f"{kernel['name']}: {total} B of LDS per workgroup > {limit} B"
    return None


def below_occupancy_floor(obs: dict, settings: PruneSettings) -> Optional[str]:
    kernel = _main(obs)
    floor = settings.floor_for(kernel["arch"])
    if kernel["waves_per_simd"] < floor:
        return f"{kernel['waves_per_simd']} waves/SIMD < floor {floor} (limited by {kernel['limiter']})"
    return None


def cliff_victim(obs: dict, settings: PruneSettings) -> Optional[str]:
    """Allocated VGPRs a few past a cliff, and shedding them would really add resident waves."""
    kernel = _main(obs)
    past = kernel.get("vgprs_past_cliff")
    if kernel["arch"] not in AMD_ARCHS or not past or past > settings.cliff_margin:
        return None
    at_cliff = kernel["allocated_vgprs"] - past
    better = amd_occupancy(kernel["arch"], at_cliff, kernel["sgpr_count"], kernel["lds_bytes"],
                           kernel["dynamic_lds_bytes"], kernel["num_warps"]).waves_per_simd
    if better <= kernel["waves_per_simd"]:
        return None  # another limit (LDS, workgroup size) binds: the registers cost nothing
    return (f"{kernel['allocated_vgprs']} VGPRs allocated, {past} past the {at_cliff} cliff: "
            f"{kernel['waves_per_simd']} waves/SIMD instead of {better}")


#: per-observation rules in the order they are tried
RULES: tuple[tuple[str, Callable[[dict, PruneSettings], Optional[str]]], ...] = (
    ("compile_failed", compile_failed),
    ("spills", spills),
    ("lds_over_budget", lds_over_budget),
    ("below_occupancy_floor", below_occupancy_floor),
    ("cliff_victim", cliff_victim),
)


def judge(obs: dict, settings: PruneSettings = PruneSettings()) -> Verdict:
    """The verdict of the per-observation rules alone (no duplicate check)."""
    for reason, rule in RULES:
        detail = rule(obs, settings)
        if detail is not None:
            return Verdict(False, reason, detail)
    kernel = _main(obs)
    return Verdict(True, None, f"{kernel['waves_per_simd']} waves/SIMD, limited by {kernel['limiter']}")


def prune(observations: list[dict], settings: PruneSettings = PruneSettings()) -> list[Verdict]:
    """A verdict per observation, in order; the first config of each identical binary is the one kept."""
    verdicts, kept_binaries = [], {}
    for index, obs in enumerate(observations):
        verdict = judge(obs, settings)
        if verdict.kept:
            first = kept_binaries.setdefault(obs["binary_sha256"], index)
            if first != index:
                verdict = Verdict(False, "duplicate_binary", f"same code object as config #{first}")
        verdicts.append(verdict)
    if observations and not any(v.kept for v in verdicts):
        best = _best_available(observations)
        if best is not None:
            verdicts[best] = Verdict(True, KEPT_ANYWAY, f"every config was pruned; kept the best-occupancy one "
                                                        f"(was: {verdicts[best].reason}: {verdicts[best].detail})")
    return verdicts


def _best_available(observations: list[dict]) -> Optional[int]:
    compiled = [i for i, obs in enumerate(observations) if obs["status"] == "ok"]
    if not compiled:
        return None

    def rank(i):
        k = _main(observations[i])
        return (-k["waves_per_simd"], k["vgpr_spill_count"] + (k["scratch_bytes"] or 0), k["allocated_vgprs"] or 0)

    return min(compiled, key=rank)


def survivors(configs: list, observations: list[dict], settings: PruneSettings = PruneSettings()) -> list:
    """The configs whose observation is kept (never empty when any config compiled)."""
    return [cfg for cfg, verdict in zip(configs, prune(observations, settings)) if verdict.kept]
