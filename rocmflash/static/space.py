"""The config space: which kernel configs a sweep compiles for one GPU and problem.

A space is, per variant, a list of values for each knob, plus restrictions: plain
Python predicates over ``(config, problem, gpu)`` that say whether a combination is
worth compiling at all (no string evaluation). The default spaces span what AMD's own
FlashAttention configs use (BLOCK_M x BLOCK_N = 128 x {32, 64, 128}, num_warps 4,
num_stages 1, waves_per_eu 1..3) and more: 64/256-row tiles, 8 warps, both MFMA
shapes, PRE_LOAD_V, and the three accumulator-lifetime variants beside ``online``.

On gfx950 the ``online`` space also tries ``num_stages=2``: Triton's AMD pipeliner double-buffers
K/V in LDS only from two stages on, and that is where gfx950's async copy (direct-to-LDS loads,
Triton's default there from 3.8, ``TRITON_HIP_USE_ASYNC_COPY=1`` before) and block ping-pong
(on with async copy) come in. gfx950's 160 KiB of LDS holds the second stage; the static checks
(LDS budget, spills, occupancy) judge each such config like any other. gfx90a and gfx942 keep
one stage (64 KiB of LDS, no async copy).

**fp8** (``Problem.dtype == "fp8"``): the fp8 forward (:mod:`rocmflash.kernels.fp8.forward`) is one
kernel, the online one, with key blocks of at least 32 (the K of its fp8 P·V dot), so its space is
the ``online`` space with that bound (:func:`default_space` with ``dtype="fp8"``). The format is the
arch's e4m3 (:func:`fp8_format`); an arch without fp8 matrix instructions (gfx90a, sm_80) has no
fp8 space: a one-line ``ValueError`` before anything compiles.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Callable, Iterable, Optional

from rocmflash.config import FP8, KPACK_ONE_ONLY_ARCHS, VARIANTS, KernelConfig, Problem, normalize_problem_dtype
from rocmflash.hw.gpus import GPU

#: knob names a space can list values for (KernelConfig fields)
KNOBS = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "PRE_LOAD_V", "waves_per_eu",
         "matrix_instr_nonkdim", "kpack", "schedule_hint", "num_splits", "d_chunks")
AMD_ONLY_KNOBS = ("waves_per_eu", "matrix_instr_nonkdim", "kpack", "schedule_hint")

Restriction = Callable[[KernelConfig, Problem, GPU], bool]


@dataclasses.dataclass(frozen=True)
class ConfigSpace:
    """Knob lists per variant and the restrictions every config must pass."""

    knobs: dict  #: ``{variant: {knob: [values]}}``
    restrictions: tuple = ()  #: named predicates; a config is kept when all return True

    def configs(self, problem: Problem, gpu: GPU) -> list[KernelConfig]:
        """Every allowed config, in a stable order (variant, then knob order), without duplicates."""
        seen, out = set(), []
        for variant, lists in self.knobs.items():
            names = [k for k in KNOBS if k in lists]
            for values in itertools.product(*(lists[k] for k in names)):
                cfg = KernelConfig(variant=variant, **dict(zip(names, values))).validate()
                if cfg in seen or not all(rule(cfg, problem, gpu) for rule in self.restrictions):
                    continue
                seen.add(cfg)
                out.append(cfg)
        return out

    def restrict(self, variants: Optional[Iterable[str]] = None) -> "ConfigSpace":
        """The same space limited to some variants (order kept)."""
        if variants is None:
            return self
        wanted = list(variants)
        unknown = [v for v in wanted if v not in self.knobs]
        if unknown:
            raise ValueError(f"variant(s) {unknown} not in this space; expected some of {list(self.knobs)}")
        return dataclasses.replace(self, knobs={v: self.knobs[v] for v in wanted})


# ------------------------------------------------------------------ restrictions
def tile_fits_warps(cfg: KernelConfig, problem: Problem, gpu: GPU) -> bool:
    """On AMD each wave should own at least 16 query rows (the MFMA M dimension); NVIDIA splits warps along N too."""
    return gpu.vendor != "amd" or cfg.BLOCK_M // cfg.num_warps >= 16


def big_tiles_need_eight_warps(cfg: KernelConfig, problem: Problem, gpu: GPU) -> bool:
    """A 256-row tile on 4 waves holds a 256 x D fp32 accumulator in 4 x 64 lanes: always spills on wave-64."""
    return cfg.BLOCK_M < 256 or cfg.num_warps >= 8


def waves_hint_reachable(cfg: KernelConfig, problem: Problem, gpu: GPU) -> bool:
    """``waves_per_eu`` below what the workgroup size already forces is ignored by LLVM: skip the duplicate."""
    return cfg.waves_per_eu == 0 or cfg.waves_per_eu * 4 >= cfg.num_warps


def kpack_supported(cfg: KernelConfig, problem: Problem, gpu: GPU) -> bool:
    """gfx950 has no kpack=2: Triton 3.4 fails to compile it, 3.5+ builds kpack=1 (a duplicate) with a warning."""
    return cfg.kpack == 1 or gpu.arch not in KPACK_ONE_ONLY_ARCHS


def split_d_chunk_is_real(cfg: KernelConfig, problem: Problem, gpu: GPU) -> bool:
    """Each head-dim chunk must be at least 16 wide (the smallest dot)."""
    return cfg.variant != "split_d" or problem.head_dim // cfg.d_chunks >= 16


#: the narrowest fp8 key block (:data:`rocmflash.kernels.fp8.forward.MIN_PIECE`; a test keeps them equal,
#: so that building a space needs no kernel import)
FP8_MIN_BLOCK_N = 32


def fp8_online_only(cfg: KernelConfig, problem: Problem, gpu: GPU) -> bool:
    """fp8 has one kernel, the online one (:mod:`rocmflash.kernels.fp8.forward`)."""
    return problem.dtype != FP8 or cfg.variant == "online"


def fp8_key_block_wide_enough(cfg: KernelConfig, problem: Problem, gpu: GPU) -> bool:
    """fp8 key blocks are at least 32 wide: the K of the fp8 P·V dot (NVIDIA's 8-bit MMA needs K >= 32)."""
    return problem.dtype != FP8 or cfg.BLOCK_N >= FP8_MIN_BLOCK_N


DEFAULT_RESTRICTIONS = (tile_fits_warps, big_tiles_need_eight_warps, waves_hint_reachable,
                        kpack_supported, split_d_chunk_is_real, fp8_online_only, fp8_key_block_wide_enough)


# ------------------------------------------------------------------ default spaces
#: archs whose ``online`` space adds ``num_stages=2`` (async copy / block ping-pong need a second stage)
PIPELINED_ARCHS = ("gfx950",)


def _amd_knobs(arch: str = "") -> dict:
    stages = [1, 2] if arch in PIPELINED_ARCHS else [1]
    online = {
        "BLOCK_M": [64, 128, 256], "BLOCK_N": [32, 64, 128], "num_warps": [4, 8], "num_stages": stages,
        "PRE_LOAD_V": [False, True], "waves_per_eu": [0, 1, 2, 3], "matrix_instr_nonkdim": [16, 32],
        "kpack": [1, 2],
    }
    lifetime = {
        "BLOCK_M": [64, 128], "BLOCK_N": [32, 64], "num_warps": [4, 8], "num_stages": [1],
        "waves_per_eu": [0, 2], "matrix_instr_nonkdim": [16, 32],
    }
    return {
        "online": online,
        "split_kv": dict(lifetime, num_splits=[0]),
        "two_phase": dict(lifetime),
        "split_d": dict(lifetime, d_chunks=[2]),
    }


def _nvidia_knobs() -> dict:
    online = {"BLOCK_M": [64, 128], "BLOCK_N": [32, 64, 128], "num_warps": [4, 8], "num_stages": [2, 3, 4],
              "PRE_LOAD_V": [False]}
    lifetime = {"BLOCK_M": [64, 128], "BLOCK_N": [64, 128], "num_warps": [4, 8], "num_stages": [2, 3]}
    return {
        "online": online,
        "split_kv": dict(lifetime, num_splits=[0]),
        "two_phase": dict(lifetime),
        "split_d": dict(lifetime, d_chunks=[2]),
    }


def default_space(gpu: GPU, variants: Optional[Iterable[str]] = None, dtype: Optional[str] = None) -> ConfigSpace:
    """The default space for a GPU (AMD and NVIDIA differ), optionally limited to some variants.

    ``dtype="fp8"``: the fp8 forward's space, the ``online`` one (``variants`` may name only it);
    ``ValueError`` (one line) for a GPU without fp8 matrix instructions. Other dtypes share one space.
    """
    knobs = _amd_knobs(gpu.arch) if gpu.vendor == "amd" else _nvidia_knobs()
    assert set(knobs) == set(VARIANTS)
    if dtype is not None and normalize_problem_dtype(dtype) == FP8:
        fp8_format(gpu)  # no fp8 on this arch: say so before anything compiles
        others = [v for v in (variants or ()) if v != "online"]
        if others:
            raise ValueError(f"variant(s) {others} have no fp8 build; fp8 attention runs the online kernel only "
                             "(--variant online)")
        variants = ["online"]
    return ConfigSpace(knobs, DEFAULT_RESTRICTIONS).restrict(variants)


#: the e4m3 format of each fp8 family (:func:`rocmflash.hw.fp8.fp8_family`), by its torch name
FP8_E4M3 = {"fnuz": "float8_e4m3fnuz", "ocp": "float8_e4m3fn"}


def fp8_format(gpu: GPU) -> str:
    """The torch name of the fp8 format a ``dtype="fp8"`` build of ``gpu`` reads: ``float8_e4m3fnuz`` on gfx942
    (MI300A/MI300X/MI325X), ``float8_e4m3fn`` on gfx950 (MI350X/MI355X) and sm_89+ (H100/H200).

    ``ValueError`` (one line, naming the GPU, its arch and what it lacks) where there is none."""
    from rocmflash.hw.fp8 import fp8_family

    family = fp8_family(gpu.arch)
    if family is None:
        raise ValueError(f"dtype fp8: {gpu.name} ({gpu.arch}) has no fp8 matrix instructions; fp8 attention needs "
                         "gfx942 (FNUZ e4m3), gfx950 or sm_89+ (OCP e4m3); use fp16 or bf16 on "
                         f"{gpu.arch}")
    return FP8_E4M3[family]
