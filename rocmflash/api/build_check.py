"""The run-time build check: does a served database config still build as it was tuned, under this compiler?

A config tuned under one Triton/LLVM can spill or lose occupancy under the next (issue 48). A schema-2 database
entry records the static profile each of its configs was judged by (:mod:`rocmflash.static.profile`:
``entry["static_profile"]`` for the served ``best``, ``"static_profile"`` in each ``near_best`` / ``ranked`` row)
and the compiler that produced them (``entry["compiler"]``). The first time run time launches a served config on a
live GPU, Triton compiles it anyway; this module reads that compiled kernel's own profile (:func:`kernel_profile`:
on AMD the code object, ``kernel.asm["hsaco"]``, through ``isa_tools``; on CUDA Triton's ``n_regs`` / ``n_spills``)
and compares it with the record (:func:`holds`, :func:`~rocmflash.static.profile.compare_profiles`):

* it holds: nothing changes (the usual case; no warning);
* it now spills inside the loop, keeps fewer waves per SIMD than recorded, spills past the harmless budget, or
  fails to build: the entry's next near-best config (time order), then its ranked configs (static order), then the
  arch default serve instead, each checked the same way when it is first compiled (the arch default, which has no
  record, must build without an in-loop spill). Where none holds, the entry's own winner (the incumbent) stays,
  or, when it does not even build, the first that does.

A replacement is said once per process and entry, in one ``RuntimeWarning`` naming the entry, the recorded and the
installed compiler, and the numbers. The decision is kept per (entry, compiler) in memory (:func:`check_for`), and
folded into the selection and call-plan caches (:mod:`rocmflash.api.selection`, :mod:`rocmflash.api.ops`): the
check runs once, and a call after the first pays nothing for it. An entry without a record (schema 1) is not
compared (nothing to compare with), and none of its profiles is read; only a failed build replaces its config.

The check runs only for compiled launches on a live GPU: never under Triton's interpreter or for CPU tensors, and
``isa_tools`` / :mod:`rocmflash.static.profile` are imported only when a recorded profile is compared (the one
stated build check of the run time; nothing of them is imported with this module).

``ROCMFLASH_NO_BUILD_CHECK=1`` turns the check off (read when a problem is first selected): the database's
configs serve as stored. ``rocmflash explain`` shows the same decision (:func:`decide`, with cross-compiled
profiles); ``rocmflash check-db --fix`` rewrites an entry for good.

The packed (varlen) backward has a build check of its own (:func:`usable_config`, on any device: it needs no GPU):
a config it serves that was not measured as that build (a dense ``bwd-`` entry; a varlen entry under a soft cap or a
left window) is cross-compiled once for the device's arch as the varlen kernels
(:func:`rocmflash.static.compile.observe_family_config`, in this process, cached on disk) and judged by the
pruner's :data:`BUILD_RULES`; each kernel that fails them gets the per-arch default's config.
:mod:`rocmflash.static` is imported only when such a check runs; ``ROCMFLASH_NO_BUILD_CHECK`` does not turn it off
(only configs known to build are served).
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from typing import Callable, Optional

from rocmflash.config import KernelConfig, default_config
from rocmflash.messages import error_line

#: ``ROCMFLASH_NO_BUILD_CHECK=1``: serve database configs without the first-use build check
NO_BUILD_CHECK_ENV = "ROCMFLASH_NO_BUILD_CHECK"
#: the arch default's "record": nothing recorded, but it must build without a costly spill (:func:`holds`)
DEFAULT_RECORD: dict = {}


def disabled() -> bool:
    """Whether ``ROCMFLASH_NO_BUILD_CHECK`` turns the check off."""
    return os.environ.get(NO_BUILD_CHECK_ENV, "0").strip().lower() not in ("", "0", "false", "off", "no")


def live(device) -> bool:
    """Whether a launch on ``device`` compiles for a live GPU (a CUDA/ROCm device, not under the interpreter)."""
    from rocmflash.kernels.launch import interpreting

    return getattr(device, "type", None) == "cuda" and not interpreting()


def armed(device) -> bool:
    """Whether a selection for ``device`` gets a first-use build check: a live GPU and the switch not set."""
    return not disabled() and live(device)


# ---------------------------------------------------------------------- the comparison
def holds(then: Optional[dict], now: dict) -> tuple:
    """``(holds, why not)`` of a build compiled ``now`` (a profile) against its record ``then``: a failed build never
    holds; without a record (None) any build holds (nothing to compare); else what got worse
    (:func:`~rocmflash.static.profile.compare_profiles`' regressions: an in-loop spill, fewer waves per SIMD, scratch
    past the harmless budget) is why it does not."""
    if now.get("status") != "ok":
        return False, [f"fails to build ({now.get('error') or 'compile failed'})"]
    if then is None:
        return True, []
    from rocmflash.static.profile import compare_profiles

    regressions, _ = compare_profiles(then, now)
    return not regressions, regressions


@dataclasses.dataclass
class Candidate:
    """A config the check may serve: ``label`` (``best``, ``near_best[0]``, ``ranked[2]``, ``default``), the config,
    and the profile it is compared with (None: none recorded; :data:`DEFAULT_RECORD` for the arch default)."""

    label: str
    config: KernelConfig
    then: Optional[dict]


def candidates(entry: dict, served: KernelConfig, arch: Optional[str], head_dim: int, variant: str) -> list:
    """The configs a check of ``entry`` tries, in order: the served one (``served``, the entry's ``best`` for
    ``variant``), its ``near_best`` rows (time order), its ``ranked`` rows (static order), then the arch default;
    each config once, of ``variant`` only, the unreadable ones left out (as run time would refuse them)."""
    recorded = entry.get("static_profile") if isinstance(entry.get("static_profile"), dict) else None
    out = [Candidate("best", served, recorded)]
    for role in ("near_best", "ranked"):
        rows = entry.get(role)
        for i, row in enumerate(rows if isinstance(rows, list) else ()):
            cfg = _row_config(row)
            if cfg is not None and cfg.variant == variant and all(c.config != cfg for c in out):
                then = row.get("static_profile")
                out.append(Candidate(f"{role}[{i}]", cfg, then if isinstance(then, dict) else None))
    fallback = default_config(arch, head_dim, variant)
    if all(c.config != fallback for c in out):
        out.append(Candidate("default", fallback, DEFAULT_RECORD))
    return out


def _row_config(row) -> Optional[KernelConfig]:
    """A ``near_best`` / ``ranked`` row's config, or None where it cannot be read or fails validation."""
    if not isinstance(row, dict) or not isinstance(row.get("config"), dict):
        return None
    try:
        return KernelConfig.from_dict(row["config"]).validate()
    except (KeyError, TypeError, ValueError):
        return None


@dataclasses.dataclass
class Check:
    """The build check of one entry under one compiler: the :func:`candidates`, which one serves now
    (:meth:`config`), whether that is decided (``final``), and what was turned down and why (``rejected``:
    ``(candidate, profile now, reasons)``). ``listeners`` are called with the check when the served config
    changes (the selection caches keep what it serves)."""

    key: str
    path: Optional[str]
    backend: str
    candidates: list
    recorded_compiler: Optional[dict] = None
    warn: bool = True  #: warn once on a replacement (``explain``'s checks do not)
    index: int = 0
    final: bool = False
    exhausted: bool = False  #: no candidate builds at all
    rejected: list = dataclasses.field(default_factory=list)
    now: Optional[dict] = None  #: the served config's profile now, once decided (None: not read)
    listeners: list = dataclasses.field(default_factory=list)

    def config(self) -> KernelConfig:
        """The config to serve now (the one being checked, until :attr:`final`)."""
        return self.candidates[self.index].config

    def needs_profile(self) -> bool:
        """Whether judging the current candidate reads its compiled profile (it has a record to compare with)."""
        return self.candidates[self.index].then is not None

    def observe(self, now: dict) -> None:
        """Judge the current candidate by its profile ``now`` (:func:`holds`): keep it, or move to the next."""
        if self.final:
            return
        cand = self.candidates[self.index]
        ok, why = holds(cand.then, now)
        if ok:
            self._settle(self.index, now)
            return
        self.rejected.append((cand, now, why))
        if self.index + 1 < len(self.candidates):
            self.index += 1
            self._changed()
            return
        built = [c for c, p, _ in self.rejected if p.get("status") == "ok"]
        if not built:  # not one candidate builds: nothing to serve (the caller raises the build error)
            self.final = self.exhausted = True
            return
        # none holds: the incumbent (the entry's own winner) where it builds, else the first that does
        self._settle(self.candidates.index(built[0]), next(p for c, p, _ in self.rejected if c is built[0]))

    def _settle(self, index: int, now: dict) -> None:
        self.index, self.final, self.now = index, True, now
        self._changed()
        if self.rejected and self.warn:
            _warn_once(self)

    def _changed(self) -> None:
        for listener in list(self.listeners):
            listener(self)

    @property
    def replaced(self) -> bool:
        """Whether a config other than the entry's served one serves (or is being checked)."""
        return self.index > 0

    def summary(self) -> str:
        """One line: ``holds``, or ``served X instead of Y because ...`` (``checking X`` while undecided)."""
        cur = self.candidates[self.index]
        if not self.rejected:
            return ("the served config holds under the installed compiler" if self.final
                    else "not checked yet (at its first compiled launch)")
        reasons = "; ".join(f"{c.label} {config_label(c.config)}: {', '.join(why)} "
                            f"(recorded {_label(c.then)}, now {_label(p)})" for c, p, why in self.rejected)
        if self.exhausted:
            return f"no candidate builds: {reasons}"
        if not self.final:
            return f"checking {cur.label} {config_label(cur.config)} because {reasons}"
        if cur.label == "best":
            return f"served {config_label(cur.config)} (best) although no candidate holds: {reasons}"
        first = self.candidates[0]
        return (f"served {config_label(cur.config)} ({cur.label}) instead of {config_label(first.config)} (best) "
                f"because {reasons}")


def _label(profile: Optional[dict]) -> str:
    from rocmflash.static.profile import profile_label

    return profile_label(profile) if profile else "none"


def config_label(cfg: KernelConfig) -> str:
    """``128x64 w8 s1`` (+ AMD's ``wpe2``, ``kp2`` where set): a config in one short word group."""
    text = f"{cfg.BLOCK_M}x{cfg.BLOCK_N} w{cfg.num_warps} s{cfg.num_stages}"
    for name, tag, unset in (("waves_per_eu", "wpe", 0), ("kpack", "kp", 1), ("matrix_instr_nonkdim", "m", 0)):
        value = getattr(cfg, name, unset)
        if value and value != unset:
            text += f" {tag}{value}"
    return text


# ---------------------------------------------------------------------- the cache of decisions
_CHECKS: dict = {}  #: (path, entry key, variant, compiler) -> Check (cleared with the selection caches)
_WARNED: set = set()  #: (path, entry key, variant, compiler) warned of: once per process, across cache clears


def _compiler_key(backend: str) -> tuple:
    """What names the installed compiler for the decision cache, cheaply (no compile): Triton's version, backend."""
    import triton

    return (triton.__version__, backend)


def check_for(path: Optional[str], key: str, entry: dict, served: KernelConfig, arch: Optional[str], head_dim: int,
              variant: str, backend: str) -> Check:
    """The run-time :class:`Check` of ``entry`` (stored under ``key`` in ``path``) for ``variant`` under the
    installed compiler: made once, then the same object (its decision) for every problem the entry serves."""
    cache_key = (path, key, variant, _compiler_key(backend))
    check = _CHECKS.get(cache_key)
    if check is None:
        check = _CHECKS[cache_key] = Check(key, path, backend, candidates(entry, served, arch, head_dim, variant),
                                           entry.get("compiler") if isinstance(entry.get("compiler"), dict) else None)
    return check


def clear() -> None:
    """Forget every decision (the database may have been rewritten); warnings already given stay given."""
    _CHECKS.clear()


def _warn_once(check: Check) -> None:
    """The one ``RuntimeWarning`` of a replaced config: entry, both compilers, the numbers, what serves."""
    key = (check.path, check.key, check.candidates[0].config.variant, _compiler_key(check.backend))
    if key in _WARNED:
        return
    _WARNED.add(key)
    warnings.warn(f"rocmflash: database entry {check.key} ({check.path}): tuned under "
                  f"{compiler_text(check.recorded_compiler)}, checked at first use under "
                  f"{compiler_text(_installed_compiler(check.backend))}: {check.summary()}. "
                  f"`rocmflash check-db --fix` rewrites the entry; {NO_BUILD_CHECK_ENV}=1 turns this check off",
                  RuntimeWarning, stacklevel=2)


def compiler_text(compiler: Optional[dict]) -> str:
    """``Triton 3.6.0 (LLVM 22.0.0 f6ded0be12)`` (CUDA: ptxas's version line in its place), or ``an unrecorded
    compiler``."""
    if not compiler:
        return "an unrecorded compiler"
    llvm = compiler.get("llvm") or ""
    tail = " ".join(x for x in (llvm, (compiler.get("llvm_hash") or "")[:10]) if x)
    if tail:
        return f"Triton {compiler.get('triton')} (LLVM {tail})"
    producer = compiler.get("producer")
    return f"Triton {compiler.get('triton')}" + (f" ({str(producer)[:80]})" if producer else "")


def _installed_compiler(backend: str) -> dict:
    """:func:`~rocmflash.static.profile.compiler_identity` for the warning (read once, only when warning)."""
    import triton

    try:
        from rocmflash.static.profile import compiler_identity

        return compiler_identity(backend)
    except Exception:  # noqa: BLE001 - the warning names what it can: the version at least
        return {"triton": triton.__version__}


# ---------------------------------------------------------------------- reading a compiled kernel
def kernel_profile(launch, backend: str) -> dict:
    """The static profile (:func:`~rocmflash.static.profile.static_profile`) of a compiled kernel: ``launch`` is a
    :class:`rocmflash.kernels.launch.CompiledLaunch` (its ``compiled``: Triton's ``CompiledKernel``). The one
    function that reads a compiled kernel (tests stand a compiler in for it).

    AMD: the code object (``asm["hsaco"]``) through ``isa_tools``, as the tune's static phase reads it (the same
    summary, so the same fields as the record). CUDA: Triton's ``n_regs`` / ``n_spills`` of a kernel loaded on the
    device (occupancy from them, the shared memory and the warps, as ``isa_tools`` computes it; a spilled register
    is 4 bytes of local memory per thread), or the cubin through ``isa_tools`` for a kernel never loaded."""
    from rocmflash.static.profile import static_profile

    compiled = launch.compiled
    meta = compiled.metadata
    if backend == "hip":
        from isa_tools import kernel_summary, read_code_object

        (resources,) = read_code_object(compiled.asm["hsaco"])
        summary = kernel_summary(resources, meta.shared, meta.num_warps, compiled.asm.get("amdgcn"))
    elif getattr(compiled, "n_regs", None) is not None:
        summary = _cuda_loaded_summary(compiled)
    else:
        from isa_tools import read_cubin
        from isa_tools.summary import cuda_kernel_summary

        (resources,) = read_cubin(compiled.asm["cubin"])
        summary = cuda_kernel_summary(resources, meta.shared, meta.num_warps)
    return static_profile({"status": "ok", "kernels": [summary]})


def _cuda_loaded_summary(compiled) -> dict:
    """An ``isa_tools`` kernel summary (the keys :func:`static_profile` reads) from a loaded CUDA kernel."""
    from isa_tools.occupancy import nvidia_occupancy

    meta = compiled.metadata
    regs, spills = int(compiled.n_regs), int(compiled.n_spills)
    occ = nvidia_occupancy(meta.target.arch, regs, int(meta.shared), int(meta.num_warps))
    limiter = {"registers": "vgpr", "shared": "lds", "blocks": "workgroup", "warps": "max_waves"}
    return {"name": compiled.name, "vgpr_count": regs, "allocated_vgprs": regs, "agpr_count": 0, "sgpr_count": None,
            "vgpr_spill_count": spills, "sgpr_spill_count": 0, "scratch_bytes": 4 * spills,
            "scratch_asm_known": False, "lds_bytes": int(meta.shared), "dynamic_lds_bytes": 0,
            "waves_per_simd": occ.warps_per_sm // 4, "limiter": limiter.get(occ.limiter, occ.limiter)}


def is_build_failure(err: BaseException) -> bool:
    """Whether a launch's exception is Triton failing to build or load the kernel (a compile error, too many
    resources), not a fault of the call: only those move a check to its next candidate."""
    module = type(err).__module__ or ""
    return module.startswith("triton.") or type(err).__name__ in ("CompilationError", "OutOfResources")


def failed_profile(err: BaseException) -> dict:
    """The profile of a build that failed with ``err``."""
    return {"status": "failed", "error": error_line(err)}


def observe_launch(check: Check, seen: list, cfg: KernelConfig) -> None:
    """Judge ``check``'s current candidate (``cfg``) by the compiled launches ``seen`` (what
    :func:`rocmflash.kernels.launch.watch_compiles` recorded). No compile of ``cfg`` seen (a launch replayed a plan
    made before the check): it stays undecided, for the next first launch to judge. A candidate with no record holds
    on building, and its profile is not read."""
    if check.final:
        return
    launch = next((r for r in seen if r.cfg == cfg), None)
    if launch is None:
        return
    check.observe(kernel_profile(launch, check.backend) if check.needs_profile() else {"status": "ok"})


def decide(check: Check, profile_of: Callable[[KernelConfig], dict]) -> Check:
    """Run ``check`` to its decision with ``profile_of(config)`` giving each candidate's profile (``rocmflash
    explain``: cross-compiled on the CPU); the same comparison as the run time's."""
    while not check.final:
        check.observe(profile_of(check.config()))
    return check


# ---------------------------------------------------------------------- the varlen backward's build rule
#: the pruner's rules a config must pass as a varlen build to be served: it compiles, spills nothing that costs
#: every loop iteration, fits the LDS/shared memory (the occupancy rules judge speed, which a measurement did)
BUILD_RULES = ("compile_failed", "spills", "lds_over_budget")


def build_problem(head_dim: int, dtype, group: int, causal: bool, softcap: bool = False,
                  window: bool = False) -> dict:
    """The compile problem of a varlen backward call (:func:`rocmflash.tuning.varlen_bwd.compile_task`'s
    ``problem``): ``heads_kv`` 8 as the register studies of :mod:`rocmflash.kernels.varlen.host` build them (it only
    sets strides); without a cap or a window, the :meth:`~rocmflash.tuning.varlen.VarlenProblem.compile_dict` of
    such a problem (a tune's cached builds serve)."""
    from rocmflash.config import normalize_dtype

    problem = {"head_dim": int(head_dim), "dtype": normalize_dtype(dtype), "group": int(group), "heads_kv": 8,
               "causal": bool(causal)}
    return dict(problem, **{name: True for name, on in (("softcap", softcap), ("window", window)) if on})


def build_rejection(gpu, kernel: str, cfg, problem: dict, cache_dir=None) -> Optional[str]:
    """Why ``cfg`` (a :class:`KernelConfig`) must not run as the varlen ``kernel`` (``"dq"``/``"dkdv"``) on
    ``gpu``'s arch for ``problem`` (:func:`build_problem`), or None: cross-compiled in this process (or read
    from the static phase's cache, :func:`rocmflash.static.compile.observe_family_config`) and judged by
    :data:`BUILD_RULES` (:mod:`rocmflash.static.prune`)."""
    from rocmflash.kernels.backward.host import space_point
    from rocmflash.static import prune
    from rocmflash.static.compile import observe_family_config

    obs = observe_family_config("varlen_bwd", space_point(kernel, cfg), problem, gpu, cache_dir)
    return prune.first_rejection(obs, BUILD_RULES)


def usable_config(gpu_name: str, cfg, fallback, problem: dict, cache_dir=None) -> tuple:
    """``(config, replaced)``: ``cfg`` (a ``BwdConfig``) with each kernel whose varlen build
    :func:`build_rejection` rejects on ``gpu_name``'s arch replaced by ``fallback``'s (the per-arch default);
    ``replaced`` maps such kernels to the reason. Kernels equal to the fallback's are not compiled. A check
    that cannot run (no compiler for the arch here, an unreadable code object) replaces the kernel too:
    only configs known to build are served."""
    from rocmflash.hw.gpus import get_gpu

    gpu = get_gpu(gpu_name)
    replaced = {}
    for kernel in ("dq", "dkdv"):
        mine, safe = getattr(cfg, kernel), getattr(fallback, kernel)
        if mine == safe:
            continue
        try:
            why = build_rejection(gpu, kernel, mine, problem, cache_dir)
        except Exception as err:  # the check itself failed: do not serve what was not checked
            why = f"build check failed: {error_line(err, 200)}"
        if why is not None:
            replaced[kernel] = why
            cfg = dataclasses.replace(cfg, **{kernel: safe})
    return cfg, replaced


__all__ = ["NO_BUILD_CHECK_ENV", "disabled", "armed", "holds", "Candidate", "candidates", "Check", "check_for",
           "clear", "kernel_profile", "is_build_failure", "failed_profile", "observe_launch", "decide",
           "config_label", "compiler_text", "BUILD_RULES", "build_problem", "build_rejection", "usable_config"]
