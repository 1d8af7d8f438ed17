"""Prune configs on compiler truth, before any GPU time is spent.

Every rule is a pure function of one observation (what :mod:`rocmflash.static.compile`
read from the code object) and the settings, returning ``None`` to keep or a
sentence explaining the rejection. Rules run in a fixed order and the first that
rejects names the reason:

``compile_failed`` → ``spills`` → ``lds_over_budget`` → ``below_occupancy_floor`` →
``cliff_victim`` → ``duplicate_binary``

``spills`` reads the evidence of the assembly (:mod:`isa_tools.scratch`): scratch
traffic inside a loop body is paid on every KV-loop iteration and prunes; a few
bytes stored and reloaded only outside loops are paid once per workgroup, and SGPRs
parked in VGPR lanes cost register moves, not memory traffic. A config whose spills
are only of those two cheap kinds is kept with reason ``harmless_spill`` and the
evidence in its detail, unless a later rule prunes it. The thresholds come from
``docs/evidence/spill-evidence-2026-11-23.md``; "harmless" is inferred from the ISA, not
timed on an AMD GPU. On NVIDIA (no SASS is read) a spill of at most
``harmless_spill_bytes`` per thread goes to L1-cached local memory and is kept for the
live phase to judge: on an H100 a 64 B/thread spilling config was the fastest of a
held-out problem by 8% (``docs/evidence/race-heldout-2026-11-23-h100.md``).

Occupancy rules judge only an occupancy the compiler fell to: an AMD kernel that sits
exactly at the ``waves_per_eu`` its config asked for (AMD's own tuned lists ship one-wave
and two-wave tiles) passes the default floor and is no cliff victim
(:func:`occupancy_was_asked_for`) -- where the request is exact, from Triton 3.6 on; Triton
3.4/3.5 pass ``waves_per_eu`` to LLVM as a minimum only, which asks for no occupancy ceiling.

The pruner never returns an empty set: if every config is rejected it keeps the
compiled one with the best occupancy and says so (reason ``kept_best_of_pruned``).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

from isa_tools import AMD_ARCHS, NVIDIA_ARCHS, amd_occupancy
from isa_tools.scratch import ScratchUse
from rocmflash.config import waves_per_eu_is_exact

REASONS = ("compile_failed", "spills", "lds_over_budget", "below_occupancy_floor", "cliff_victim",
           "duplicate_binary")
KEPT_ANYWAY = "kept_best_of_pruned"
#: reason of a kept config that spills, but only where it costs little (:func:`harmless_spill`)
HARMLESS_SPILL = "harmless_spill"
#: most scratch bytes per lane an outside-the-loop spill may use and still count as harmless
#: (docs/evidence/spill-evidence-2026-11-23.md: outside-only spills of the online spaces use 8-44 B)
HARMLESS_SPILL_BYTES = 64
#: most v_writelane/v_readlane (SGPR spills kept in VGPR lanes) a loop may hold, as a share of its
#: instructions, for the SGPR spill to count as harmless (same report: a gap between 2.4% and 4.6%)
HARMLESS_LANE_SHARE = 1 / 32


@dataclasses.dataclass(frozen=True)
class PruneSettings:
    """Knobs of the pruner.

    ``occupancy_floor``: fewest waves per SIMD (AMD) or warps per scheduler (NVIDIA) a
    config must reach; None picks 2 on AMD (one wave per SIMD leaves nothing to hide
    memory latency behind in the KV loop, unless the config asked for it: see
    :func:`occupancy_was_asked_for`) and 1 on NVIDIA; a floor set here applies to every
    config. ``cliff_margin``: a config
    whose allocated VGPRs are at most this many past an occupancy cliff, and that would
    gain resident waves by shedding them, is a cliff victim. ``lds_budget``: optional
    cap on LDS/shared bytes per workgroup below the hardware maximum.
    ``allow_spills``: never prune for spilling. ``harmless_spill_bytes``: the most
    scratch per lane a spill may use and still be kept, when the assembly shows all of
    its scratch traffic outside loops. ``triton_version``: the Triton that compiled the
    observations (None: the installed one, which compiled every observation of this process:
    the sweep cache is keyed by Triton version); it decides whether ``waves_per_eu`` was an
    exact request (:func:`occupancy_was_asked_for`).
    """

    occupancy_floor: Optional[int] = None
    cliff_margin: int = 16
    lds_budget: Optional[int] = None
    allow_spills: bool = False
    harmless_spill_bytes: int = HARMLESS_SPILL_BYTES
    triton_version: Optional[str] = None

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
    """A spill that costs every KV-loop iteration, or too much scratch, as the assembly shows it.

    Pruned: scratch loads/stores inside a loop body; scratch use above
    ``settings.harmless_spill_bytes`` per lane; SGPR spills whose VGPR-lane moves are
    more than :data:`HARMLESS_LANE_SHARE` of a loop's instructions; a spill whose
    assembly was not read (NVIDIA, a bare code object) or shows none of the spill code
    the metadata promises. Kept (see :func:`harmless_spill`): scratch only outside
    loops within the byte budget, and SGPR spills parked in VGPR lanes (no memory
    traffic) with few lane moves in the loop.
    """
    if settings.allow_spills:
        return None
    for kernel in obs["kernels"]:
        harm = _spill_harm(kernel, settings)
        if harm is not None:
            return f"{kernel['name']}: {_spill_counts(kernel)}; {harm}"
    return None


def harmless_spill(obs: dict, settings: PruneSettings) -> Optional[str]:
    """Why the spills of a config the :func:`spills` rule let through cost little, or None if none spills."""
    notes = []
    for kernel in obs["kernels"]:
        if _spilled(kernel) and _spill_harm(kernel, settings) is None:
            notes.append(f"{kernel['name']}: {_spill_counts(kernel)}; {_why_harmless(kernel, settings)}")
    return "; ".join(notes) or None


def _spilled(kernel: dict) -> bool:
    return bool(kernel["vgpr_spill_count"] or kernel["sgpr_spill_count"] or kernel["scratch_bytes"])


def _spill_counts(kernel: dict) -> str:
    return (f"{kernel['vgpr_spill_count']} VGPR and {kernel['sgpr_spill_count'] or 0} SGPR spills, "
            f"{kernel['scratch_bytes']} B scratch per lane")


def _spill_harm(kernel: dict, settings: PruneSettings) -> Optional[str]:
    """Why this kernel's spill is a cliff (None: no spill, or a harmless one)."""
    if not _spilled(kernel):
        return None
    use = ScratchUse.from_dict(kernel)
    if not use.known and kernel.get("arch") in NVIDIA_ARCHS:
        if (kernel["scratch_bytes"] or 0) <= settings.harmless_spill_bytes:
            return None  # see _why_harmless: NVIDIA local memory, measured
        return (f"{kernel['scratch_bytes']} B of local memory per thread > {settings.harmless_spill_bytes} B "
                "budget (NVIDIA spill, location not read)")
    if not use.known:
        return "where it spills is unknown (no assembly read), so it is treated as in the loop"
    if ((kernel["vgpr_spill_count"] or kernel["scratch_bytes"]) and not use.ops) or \
            (kernel["sgpr_spill_count"] and not (use.ops or use.lane_ops)):
        return "the assembly shows none of the spill code the metadata promises; not trusted"
    if use.loop_ops:
        return (f"{use.loop_loads} scratch loads and {use.loop_stores} stores inside the loop "
                f"({use.loop_bytes} B per lane per pass), paid on every iteration")
    if use.loop_lane_ops > HARMLESS_LANE_SHARE * use.loop_instructions:
        return (f"SGPRs spilled to VGPR lanes, but {use.loop_lane_ops} v_writelane/v_readlane in the loop "
                f"({_share(use.loop_lane_ops, use.loop_instructions)} of its instructions, > "
                f"{HARMLESS_LANE_SHARE:.1%}), paid on every iteration")
    if kernel["scratch_bytes"] > settings.harmless_spill_bytes:
        return (f"scratch only outside loops, but {kernel['scratch_bytes']} B per lane > "
                f"{settings.harmless_spill_bytes} B budget")
    return None


def _why_harmless(kernel: dict, settings: PruneSettings) -> str:
    use = ScratchUse.from_dict(kernel)
    if not use.known and kernel.get("arch") in NVIDIA_ARCHS:
        return (f"NVIDIA local-memory spill (L1-cached) within the {settings.harmless_spill_bytes} B/thread budget: kept "
                "for measurement (H100: such a config won a held-out tune by 8%, "
                "docs/evidence/race-heldout-2026-11-23-h100.md)")
    parts = []
    if use.ops:
        parts.append(f"{use.loads} scratch loads and {use.stores} stores ({use.outside_bytes} B per lane), "
                     f"all outside the loop: paid once per workgroup")
    if use.lane_ops:
        parts.append(f"SGPRs spilled to VGPR lanes, no memory traffic ({use.lane_ops} v_writelane/v_readlane, "
                     f"{use.loop_lane_ops} in the loop = {_share(use.loop_lane_ops, use.loop_instructions)} of "
                     f"its instructions)")
    return " and ".join(parts) + " (inferred from the ISA, not timed on AMD)"


def _share(part: int, whole: int) -> str:
    return f"{part / whole:.1%}" if whole else "0%"


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


def requested_waves(obs: dict) -> int:
    """The occupancy the config asked LLVM for (``waves_per_eu``; 0 = none asked, and always 0 on NVIDIA)."""
    return int((obs.get("config") or {}).get("waves_per_eu") or 0)


def occupancy_was_asked_for(obs: dict, triton_version: Optional[str] = None) -> bool:
    """True when an AMD kernel sits exactly at the ``waves_per_eu`` its config asked for, as an exact request.

    Such an occupancy is a choice, not a cliff: the config traded resident waves for
    registers (``waves_per_eu=1`` gives a wave the whole 512-entry register file), as
    AMD's own tuned lists do (ROCm/flash-attention's gfx942/gfx950 default is 64x64 at one
    wave; ``rocmflash/reference/amd_published.json``). Whether that pays is a timing
    question for the live phase; the static score ranks such tiles behind those that keep
    two waves. The same tile without the request, when it lands at the same occupancy,
    compiles to the same registers (``docs/evidence/reference-2026-11-24/README.md``) and is
    judged by the floor as before.

    Only where the request is exact (Triton >= 3.6, ``"amdgpu-waves-per-eu"="N, N"``;
    ``triton_version`` None: the installed Triton). Triton 3.4/3.5 pass ``"N"``, a minimum: LLVM
    was never asked to stop at N waves, so landing there is a fall like any other (and
    ``waves_per_eu=1`` asks for nothing at all: it compiles to the binary of 0).
    """
    kernel = _main(obs)
    asked = requested_waves(obs)
    return (kernel["arch"] in AMD_ARCHS and asked > 0 and kernel["waves_per_simd"] == asked
            and waves_per_eu_is_exact(triton_version))


def below_occupancy_floor(obs: dict, settings: PruneSettings) -> Optional[str]:
    """Fewer resident waves than the floor, unless the config asked for exactly that many."""
    kernel = _main(obs)
    floor = settings.floor_for(kernel["arch"])
    if kernel["waves_per_simd"] < floor and not (settings.occupancy_floor is None
                                                  and occupancy_was_asked_for(obs, settings.triton_version)):
        return f"{kernel['waves_per_simd']} waves/SIMD < floor {floor} (limited by {kernel['limiter']})"
    return None


def cliff_victim(obs: dict, settings: PruneSettings) -> Optional[str]:
    """Allocated VGPRs a few past a cliff, and shedding them would really add resident waves.

    Not when the kernel sits at the occupancy its ``waves_per_eu`` asked for: the registers
    past the cliff are what the request bought, and the config asking for one more wave
    is the one that sheds them.
    """
    kernel = _main(obs)
    past = kernel.get("vgprs_past_cliff")
    if (kernel["arch"] not in AMD_ARCHS or not past or past > settings.cliff_margin
            or occupancy_was_asked_for(obs, settings.triton_version)):
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


def first_rejection(obs: dict, reasons, settings: PruneSettings = PruneSettings()) -> Optional[str]:
    """``"<reason>: <detail>"`` of the first rule named in ``reasons`` (in that order) that rejects ``obs``, or
    None: a build check that asks only some of :data:`RULES` (the run time's and ``check-db``'s)."""
    rules = dict(RULES)
    for reason in reasons:
        detail = rules[reason](obs, settings)
        if detail is not None:
            return f"{reason}: {detail}"
    return None


def judge(obs: dict, settings: PruneSettings = PruneSettings()) -> Verdict:
    """The verdict of the per-observation rules alone (no duplicate check)."""
    for reason, rule in RULES:
        detail = rule(obs, settings)
        if detail is not None:
            return Verdict(False, reason, detail)
    kernel = _main(obs)
    detail = f"{kernel['waves_per_simd']} waves/SIMD, limited by {kernel['limiter']}"
    if occupancy_was_asked_for(obs, settings.triton_version):
        detail += f", as its waves_per_eu={requested_waves(obs)} asks"
    note = harmless_spill(obs, settings)
    if note is not None:
        return Verdict(True, HARMLESS_SPILL, f"{detail}; spills kept: {note}")
    return Verdict(True, None, detail)


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
