"""Kernel configuration records: what the tuner searches over and what a compile needs.

Two records, both plain frozen dataclasses so they hash, compare and round-trip through
JSON (the tuner database stores them):

* :class:`KernelConfig` -- every knob of the forward-attention kernels: tile shape
  (``BLOCK_M``, ``BLOCK_N``), ``num_warps``, ``num_stages``, ``PRE_LOAD_V``, the
  accumulator-lifetime ``variant`` and its parameters (``num_splits`` for ``split_kv``,
  ``d_chunks`` for ``split_d``), and the AMD-only compiler options ``waves_per_eu``,
  ``matrix_instr_nonkdim``, ``kpack`` and ``schedule_hint``. ``validate()`` rejects bad
  values by name -- Triton itself silently drops unknown option names and silently
  accepts a bad ``schedule_hint``, so nothing downstream would notice. Given the target
  arch and the Triton version it also rejects what that pair cannot build as asked
  (:data:`SCHEDULE_HINT_SEMANTICS`, :data:`WAVES_PER_EU_EXACT_FROM`, :data:`KPACK_ONE_ONLY_ARCHS`).
* :class:`Problem` -- the shape/dtype facts a compile depends on (head dim, dtype,
  causal, heads, sequence lengths), so a kernel can be built for any target with no
  tensors and no GPU.

This module imports neither torch nor triton (except lazily, to cross-check option
names against the installed Triton), so it is cheap to import from the tuner.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping, Optional

VARIANTS = ("online", "split_kv", "two_phase", "split_d")

_POW2_TILES = (16, 32, 64, 128, 256)
_NUM_WARPS = (1, 2, 4, 8, 16)
_NONKDIM = (0, 16, 32)  # 0: let Triton pick (32x32 MFMA for FA-sized tiles)
_KPACK = (1, 2)
#: the values Triton 3.6's AMD backend understands (comma-separated combinations allowed)
SCHEDULE_HINTS = ("none", "attention", "memory-bound-attention", "local-prefetch")

# What each Triton (3.4..3.9) does with the AMD options: read from triton-lang/triton's
# third_party/amd/backend/compiler.py of each release, then checked by cross-compiling the
# online kernel (128x64, 4 warps, D=128) for gfx90a/gfx942/gfx950 with each release and comparing
# the code objects; tests/test_triton_semantics.py re-checks the installed Triton's row.
# "same binary as 'none'" means byte-identical code objects: the static phase collapses such configs
# (rocmflash.static.dedupe), so a space may list them without the live phase timing one binary twice.
_SAME_AS_NONE = "ignored: same binary as 'none'"
#: ``{(major, minor): {schedule_hint value: what that Triton does with it}}``; "a,b" stands for a
#: comma-separated combination
SCHEDULE_HINT_SEMANTICS = {
    (3, 4): {
        "none": "no hint passes",
        "attention": "sched-hint ops around each dot (iglp) and LLVM's sink-insts-to-avoid-spills",
        "memory-bound-attention": "not a 3.4 variant: the hint passes run with none (mostly the 'none' binary, "
                                  "not always: gfx942 at num_stages=1 differs)",
        "local-prefetch": "the stream pipeliner with global and local prefetch: fails to compile at num_stages=1 "
                          "(rejected by validate()); at num_stages>=2 a binary of its own",
        "a,b": "not split on commas: the whole string is one unknown variant (rejected by validate())",
    },
    (3, 5): {
        "none": "no hint passes",
        "attention": "sched-hint ops around each dot (iglp) and LLVM's sink-insts-to-avoid-spills",
        "memory-bound-attention": _SAME_AS_NONE,
        "local-prefetch": _SAME_AS_NONE,
        "a,b": "not split on commas: an unknown variant, same binary as 'none' (rejected by validate())",
    },
    (3, 6): {
        "none": "no hint passes",
        "attention": "sched-hint ops around each dot (iglp) and LLVM's sink-insts-to-avoid-spills",
        "memory-bound-attention": "LLVM's iterative-ILP scheduler (amdgpu-sched-strategy=iterative-ilp)",
        "local-prefetch": _SAME_AS_NONE,
        "a,b": "split on commas, each value applied",
    },
}
SCHEDULE_HINT_SEMANTICS[(3, 7)] = SCHEDULE_HINT_SEMANTICS[(3, 6)]  # same backend code for the hints
#: 3.8 dropped the hint passes ("Experimental; right now no effect"; its default became '')
SCHEDULE_HINT_SEMANTICS[(3, 8)] = {hint: _SAME_AS_NONE for hint in SCHEDULE_HINT_SEMANTICS[(3, 6)]}
SCHEDULE_HINT_SEMANTICS[(3, 8)]["none"] = "no hint passes"
SCHEDULE_HINT_SEMANTICS[(3, 9)] = SCHEDULE_HINT_SEMANTICS[(3, 8)]

#: First Triton whose ``waves_per_eu=N`` is an exact request: 3.6 and 3.7 set the LLVM attribute
#: ``"amdgpu-waves-per-eu"="N, N"`` (3.8+: ``"N,N"``, and none at all for 0). 3.4 and 3.5 set ``"N"``, a
#: minimum only: LLVM may still reach more waves, and ``waves_per_eu=1`` asks for nothing (the same
#: binary as 0, checked on gfx942/gfx950).
WAVES_PER_EU_EXACT_FROM = (3, 6)
#: ``kpack=2`` on gfx950: Triton 3.4 refuses it (``assert kpack == 1``); 3.5+ warns and builds kpack=1.
KPACK_ONE_ONLY_ARCHS = ("gfx950",)

#: options that only the AMD (``hip``) backend knows; never passed on CUDA
AMD_ONLY_OPTIONS = ("waves_per_eu", "matrix_instr_nonkdim", "kpack", "schedule_hint")

_DTYPES = {
    "fp16": "fp16", "float16": "fp16", "torch.float16": "fp16", "half": "fp16",
    "bf16": "bf16", "bfloat16": "bf16", "torch.bfloat16": "bf16",
}


def _is_pow2(x: int) -> bool:
    return isinstance(x, int) and x > 0 and (x & (x - 1)) == 0


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """One point of the kernel search space (JSON keys = field names; keep them stable).

    ``num_splits=0`` means "choose from the grid size at launch" (enough KV splits to
    put about two programs on every CU/SM). ``d_chunks`` is the number of output
    head-dim chunks of ``split_d`` (each chunk is rounded up to a power of two, so the
    effective number may be smaller for small head dims). ``waves_per_eu=0`` gives LLVM
    no occupancy hint. ``pad_head_dim=True`` forces padding a non-power-of-two head dim
    to the next power of two instead of the default two-piece split (see
    :func:`rocmflash.kernels.common.head_dim_pieces`).
    """

    BLOCK_M: int = 128
    BLOCK_N: int = 64
    num_warps: int = 4
    num_stages: int = 1
    PRE_LOAD_V: bool = False
    variant: str = "online"
    num_splits: int = 0
    d_chunks: int = 2
    waves_per_eu: int = 0
    matrix_instr_nonkdim: int = 0
    kpack: int = 1
    schedule_hint: str = "none"
    pad_head_dim: bool = False

    # ------------------------------------------------------------------ validation
    def validate(self, arch: Optional[str] = None, triton_version: Optional[str] = None) -> "KernelConfig":
        """Raise ValueError naming the first bad field and its allowed values; return self.

        ``arch`` (e.g. ``"gfx950"``) and ``triton_version`` (e.g. ``"3.6.0"``), when given, add the
        checks of what that target and Triton cannot build as asked (:data:`SCHEDULE_HINT_SEMANTICS`):
        ``kpack=2`` on gfx950 (Triton 3.4 fails, 3.5+ silently builds kpack=1), ``local-prefetch``
        at ``num_stages=1`` on Triton 3.4 (fails to compile), and a comma-separated
        ``schedule_hint`` on Triton < 3.6 (not split: read as one unknown value). A value a
        Triton merely ignores (e.g. every hint on 3.8+) stays valid: it compiles to the binary
        of ``"none"``, and the static phase drops such duplicates by binary.
        """

        def bad(field: str, allowed: str) -> None:
            raise ValueError(
                f"KernelConfig.{field}={getattr(self, field)!r} is invalid; expected {allowed}"
            )

        for f in ("BLOCK_M", "BLOCK_N"):
            v = getattr(self, f)
            if type(v) is not int or v not in _POW2_TILES:
                bad(f, f"one of {_POW2_TILES}")
        if type(self.num_warps) is not int or self.num_warps not in _NUM_WARPS:
            bad("num_warps", f"one of {_NUM_WARPS}")
        if type(self.num_stages) is not int or not 1 <= self.num_stages <= 6:
            bad("num_stages", "an int in 1..6")
        if not isinstance(self.PRE_LOAD_V, bool):
            bad("PRE_LOAD_V", "a bool")
        if self.variant not in VARIANTS:
            bad("variant", f"one of {VARIANTS}")
        if type(self.num_splits) is not int or not 0 <= self.num_splits <= 128:
            bad("num_splits", "an int in 0..128 (0 = automatic)")
        if type(self.d_chunks) is not int or not _is_pow2(self.d_chunks) or self.d_chunks > 16:
            bad("d_chunks", "a power of two in 1..16")
        if type(self.waves_per_eu) is not int or not 0 <= self.waves_per_eu <= 10:
            bad("waves_per_eu", "an int in 0..10 (0 = no occupancy hint)")
        if type(self.matrix_instr_nonkdim) is not int or self.matrix_instr_nonkdim not in _NONKDIM:
            bad("matrix_instr_nonkdim", f"one of {_NONKDIM}")
        if type(self.kpack) is not int or self.kpack not in _KPACK:
            bad("kpack", f"one of {_KPACK}")
        hints = str(self.schedule_hint).split(",") if isinstance(self.schedule_hint, str) else [None]
        if not hints or any(h not in SCHEDULE_HINTS for h in hints) or (
            "none" in hints and len(hints) > 1
        ):
            bad("schedule_hint", f"one of {SCHEDULE_HINTS} (or a comma-separated combination without 'none')")
        if not isinstance(self.pad_head_dim, bool):
            bad("pad_head_dim", "a bool")
        self._validate_for(arch, triton_version)
        return self

    def _validate_for(self, arch: Optional[str], triton_version: Optional[str]) -> None:
        """The checks that depend on the target arch and the Triton version (see :meth:`validate`)."""
        if arch is not None and not isinstance(arch, str):
            raise TypeError(f"arch={arch!r} is invalid; expected an arch string such as 'gfx950' or None")
        base = arch.split(":", 1)[0].strip().lower() if arch else None  # gfx950:sramecc+:xnack- -> gfx950
        version = triton_minor(triton_version) if triton_version is not None else None
        if base in KPACK_ONE_ONLY_ARCHS and self.kpack != 1:
            raise ValueError(f"KernelConfig.kpack={self.kpack!r} is invalid on {base}; expected 1 ({base} has no "
                             "kpack=2: Triton 3.4 refuses to compile it, 3.5+ silently builds kpack=1)")
        if version is None:
            return
        hints = self.schedule_hint.split(",")
        if version < (3, 6) and len(hints) > 1:
            raise ValueError(f"KernelConfig.schedule_hint={self.schedule_hint!r} is invalid with Triton "
                             f"{triton_version}; expected a single value (Triton < 3.6 does not split on commas)")
        if version < (3, 5) and "local-prefetch" in hints and self.num_stages < 2:
            raise ValueError(f"KernelConfig.schedule_hint='local-prefetch' is invalid at num_stages=1 with Triton "
                             f"{triton_version}; expected num_stages >= 2 (its stream prefetch fails to compile)")

    # ------------------------------------------------------------------ compile options
    def compile_options(self, backend: str) -> dict:
        """Triton compile options for ``backend`` ("hip" or "cuda"): only names that backend knows.

        AMD-only options are left out on CUDA (Triton would reject them there at launch).
        The names are cross-checked against the installed Triton's option dataclass so a
        renamed option fails loudly instead of being dropped silently.
        """
        self.validate()
        if backend not in ("hip", "cuda"):
            raise ValueError(f"backend={backend!r} is invalid; expected 'hip' or 'cuda'")
        # FP fusion stated, not defaulted: Triton 3.9 warns that its default flips in 3.10, and the
        # same config must build the same kernel on every supported Triton
        opts: dict[str, Any] = {"num_warps": self.num_warps, "num_stages": self.num_stages, "enable_fp_fusion": True}
        if backend == "hip":
            opts.update(
                waves_per_eu=self.waves_per_eu,
                matrix_instr_nonkdim=self.matrix_instr_nonkdim,
                kpack=self.kpack,
                schedule_hint=self.schedule_hint,
            )
        _check_option_names(backend, opts)
        return opts

    # ------------------------------------------------------------------ serialisation
    def to_dict(self) -> dict:
        """Plain dict with the field names as keys (JSON-ready)."""
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        """Canonical JSON (sorted keys)."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "KernelConfig":
        """Build and validate a config from a dict; unknown keys are an error (not dropped)."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown KernelConfig key(s) {unknown}; expected a subset of {sorted(names)}")
        return cls(**dict(d)).validate()

    @classmethod
    def from_json(cls, s: str) -> "KernelConfig":
        return cls.from_dict(json.loads(s))

    def replace(self, **changes) -> "KernelConfig":
        """A validated copy with some fields changed."""
        return dataclasses.replace(self, **changes).validate()


def triton_minor(version: Any) -> tuple:
    """``(major, minor)`` of a Triton version string (``"3.6.0"``, ``"3.5.1+rocm7.0"``, ``"3.4.0+gitabc"``)."""
    try:
        major, minor = str(version).strip().split(".")[:2]
        return int(major), int("".join(ch for ch in minor if ch.isdigit()) or "x")
    except (ValueError, AttributeError):
        raise ValueError(f"triton_version={version!r} is invalid; expected a version such as '3.6.0'") from None


def installed_triton_version() -> Optional[str]:
    """The importable Triton's ``__version__`` (None when Triton cannot be imported)."""
    try:
        import triton
    except Exception:  # pragma: no cover - triton is a dependency of every compile
        return None
    return str(triton.__version__)


def waves_per_eu_is_exact(triton_version: Optional[str] = None) -> bool:
    """Whether ``waves_per_eu=N`` asks LLVM for exactly N waves (Triton >= 3.6) or only for at least N.

    ``triton_version`` None: the installed Triton (the one that compiled this process's
    observations: the sweep cache is keyed by Triton version).
    """
    version = triton_version if triton_version is not None else installed_triton_version()
    return version is None or triton_minor(version) >= WAVES_PER_EU_EXACT_FROM


def schedule_hint_semantics(hint: str, triton_version: Optional[str] = None) -> str:
    """What ``triton_version`` (None: the installed one) does with ``schedule_hint=hint`` (one sentence)."""
    version = triton_version if triton_version is not None else installed_triton_version()
    known = sorted(SCHEDULE_HINT_SEMANTICS)
    row = SCHEDULE_HINT_SEMANTICS[min(max(triton_minor(version), known[0]), known[-1])]
    if "," in hint:
        return row["a,b"]
    if hint not in row:
        raise ValueError(f"schedule_hint={hint!r} is invalid; expected one of {SCHEDULE_HINTS}")
    return row[hint]


def _check_option_names(backend: str, opts: dict) -> None:
    try:
        if backend == "hip":
            from triton.backends.amd.compiler import HIPOptions as Opt
        else:
            from triton.backends.nvidia.compiler import CUDAOptions as Opt
    except Exception:  # pragma: no cover - backend not shipped in this wheel
        return
    known = {f.name for f in dataclasses.fields(Opt)}
    missing = sorted(set(opts) - known)
    if missing:
        raise RuntimeError(f"installed Triton's {backend} backend has no option(s) {missing}")


def normalize_dtype(dtype: Any) -> str:
    """'fp16' or 'bf16' from a string or torch dtype; ValueError otherwise."""
    key = str(dtype).lower()
    if key not in _DTYPES:
        raise ValueError(f"dtype={dtype!r} is unsupported; expected float16 or bfloat16")
    return _DTYPES[key]


#: a :class:`Problem` dtype for fp8 inputs: the target arch's e4m3 format (FNUZ ``float8_e4m3fnuz`` on
#: gfx942, OCP ``float8_e4m3fn`` on gfx950 and sm_89+), bf16 output. A name, not a torch dtype: which
#: bytes it means depends on the arch (:func:`rocmflash.static.space.fp8_format`)
FP8 = "fp8"
_FP8_NAMES = ("fp8", "float8")


def normalize_problem_dtype(dtype: Any) -> str:
    """'fp16', 'bf16' or :data:`FP8` (the static phase's dtypes); ValueError otherwise.

    Only :class:`Problem` takes fp8: run-time selection, the tuner and the databases keep
    :func:`normalize_dtype` (fp16/bf16), so an fp8 problem cannot reach a path that has no fp8 build.
    """
    if str(dtype).lower() in _FP8_NAMES:
        return FP8
    if str(dtype).lower() not in _DTYPES:
        raise ValueError(f"dtype={dtype!r} is unsupported; expected float16, bfloat16 or fp8")
    return _DTYPES[str(dtype).lower()]


@dataclasses.dataclass(frozen=True)
class Problem:
    """What a compile-only build needs to know about the attention call (no tensors).

    Strides are taken as those of contiguous ``(B, H, S, D)`` tensors. Sequence lengths
    only matter through Triton's specialisation (divisible by 16 or not), so the
    defaults are fine for register/occupancy studies.

    ``dtype``: ``fp16``, ``bf16`` or ``fp8`` (:data:`FP8`: Q, K and V in the target's e4m3 format,
    bf16 output). Only the forward's ``online`` variant has an fp8 build
    (:mod:`rocmflash.kernels.fp8.forward`, routed by :func:`rocmflash.static.compile.compile_forward`).
    """

    head_dim: int = 128
    dtype: str = "fp16"
    causal: bool = False
    batch: int = 1
    heads_q: int = 16
    heads_kv: int = 16
    seqlen_q: int = 4096
    seqlen_k: int = 4096
    store_lse: bool = False

    def __post_init__(self):
        object.__setattr__(self, "dtype", normalize_problem_dtype(self.dtype))
        if type(self.head_dim) is not int or not 16 <= self.head_dim <= 256:
            raise ValueError(f"Problem.head_dim={self.head_dim!r} is invalid; expected an int in 16..256")
        for f in ("batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k"):
            if type(getattr(self, f)) is not int or getattr(self, f) < 1:
                raise ValueError(f"Problem.{f}={getattr(self, f)!r} is invalid; expected a positive int")
        if self.heads_q % self.heads_kv:
            raise ValueError(
                f"Problem.heads_q={self.heads_q} is not a multiple of heads_kv={self.heads_kv}"
            )

    @property
    def gqa_ratio(self) -> int:
        return self.heads_q // self.heads_kv

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Problem":
        return cls(**dict(d))


# ---------------------------------------------------------------------- defaults
def default_config(
    arch: Optional[str] = None, head_dim: int = 128, variant: str = "online", gpu: Any = None
) -> KernelConfig:
    """A sensible starting config per architecture and head dim, until the tuner's DB exists.

    Reasoning:

    * **AMD CDNA (gfx90a/gfx942/gfx950)**: FA is two fused GEMMs, so ``num_stages=1``
      (AMD guidance); ``num_warps=4`` keeps the 4 waves of a workgroup on the 4 SIMDs.
      The fp32 accumulator dominates VGPRs on wave-64: ``BLOCK_M x D`` floats spread
      over ``num_warps x 64`` lanes, i.e. 64 VGPRs/lane for BM=128, D=128, 4 warps, plus
      the Q tile, scores and P. BM=128/BN=64 at ``waves_per_eu=2`` (<= 256 VGPRs) fits that;
      for D > 128 BM drops to 64 and BN to 32 so the accumulator does not force 1 wave/SIMD
      and nothing spills (cross-compiled: 220-254 VGPRs, 0 spills, 2 waves at D = 192/256 on
      gfx90a/gfx942/gfx950, causal and not; ``docs/evidence/bwd-amd-registers-2026-11-23.md``). On
      gfx90a with 16x16 MFMAs: compiled as a launch is (buffer loads), Triton 3.9 spills 4
      VGPRs inside the loop at D=256 with the default 32x32 ones; 16x16 fits (210-216 VGPRs,
      2 waves; Triton 3.6: 193-256, one spill outside the loop at D=256 causal).
    * **NVIDIA sm_90 (H100/H200)**: the best of a 36-config sweep (+PRE_LOAD_V) of the
      ``online`` kernel on an H100 (bf16, S=4096): BM=128, BN=64, 8 warps, PRE_LOAD_V,
      3 stages (D=128) or 4 (D=64); D > 128 keeps BN=64 with 2 stages for shared memory.
    * **other / unknown** (including the CPU interpreter): BM=64, BN=64, 4 warps, 2 stages.
    """
    if gpu is not None:
        arch = gpu.arch
    if arch is None:
        arch = "generic"
    if variant not in VARIANTS:
        raise ValueError(f"variant={variant!r} is invalid; expected one of {VARIANTS}")
    if arch.startswith("gfx9"):
        if head_dim <= 64:
            cfg = KernelConfig(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=1, waves_per_eu=2)
        elif head_dim <= 128:
            cfg = KernelConfig(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=1, waves_per_eu=2,
                               PRE_LOAD_V=False)
        elif arch == "gfx90a":  # 64x32 with 32x32 MFMAs reloads 4 spilled VGPRs in the loop at D=256 (Triton 3.9)
            cfg = KernelConfig(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=1, waves_per_eu=2,
                               matrix_instr_nonkdim=16)
        else:  # 64x64 spilled 24-56 VGPRs at D = 192/256 on gfx90a/gfx942; 64x32 fits in 2 waves everywhere
            cfg = KernelConfig(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=1, waves_per_eu=2)
    elif arch == "sm_90":
        # measured on an H100 (docs/evidence/attention-2026-11-21-h100.md): best of 37 configs
        if head_dim <= 64:
            cfg = KernelConfig(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=4, PRE_LOAD_V=True)
        elif head_dim <= 128:
            cfg = KernelConfig(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3, PRE_LOAD_V=True)
        else:
            cfg = KernelConfig(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=2)
    elif arch.startswith("sm_"):
        if head_dim <= 128:
            cfg = KernelConfig(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=3)
        else:
            cfg = KernelConfig(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2)
    else:
        cfg = KernelConfig(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2)
    return cfg.replace(variant=variant)
