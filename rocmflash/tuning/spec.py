"""What a tune is asked to do: :class:`TuneSpec`, its defaults and the static problem of a shape."""

from __future__ import annotations

import dataclasses
from typing import Optional

from rocmflash.config import FP8, Problem, normalize_problem_dtype
from rocmflash.hw.roofline import Shape
from rocmflash.static.prune import PruneSettings
from rocmflash.tuning.live_worker import LiveSettings

STRATEGIES = ("race", "pruned", "exhaustive")
NEAR_BEST_PCT = 3.0
DEFAULT_TOP_K_FRACTION = 0.15
INJECT_ENV = "ROCMFLASH_TUNE_INJECT"
TOKENS_PER_BATCH = 16384  # default batch: 16k tokens (B = 16384 // S), as in reports/
HEADS_TIMES_D = 2048  # default heads: H x D = 2048

STATIC_SCORE_DOC = ("static score (no timing): variant work factor (online 1, split_kv 1.05, split_d (c+1)/2, "
                    "two_phase 1.5), then BLOCK_M/num_warps >= 16 rows per warp first; NVIDIA: occupancy "
                    "(warps/scheduler) higher first, then fewer registers, larger BLOCK_N, more num_stages; AMD: "
                    "tiles keeping 2 waves/SIMD first, then larger BLOCK_M (to 128) and BLOCK_N (to 64), then "
                    "occupancy, fewer VGPRs, more num_stages")


class NoLiveGPUError(ValueError):
    """A tune that must measure (``--gpu auto``, ``--strategy exhaustive``) found no usable live GPU."""


# ====================================================================== the request
@dataclasses.dataclass
class TuneSpec:
    gpu: str
    head_dim: int
    dtype: str  #: fp16, bf16 or fp8 (the GPU's e4m3 format, bf16 output: :mod:`rocmflash.kernels.fp8.forward`)
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
    seeds: bool = True  #: always time the AMD-published configs of the GPU's arch (:mod:`rocmflash.static.seeds`)
    incumbent: bool = True  #: also time the platform's SDPA backends (:mod:`rocmflash.api.incumbent`); --no-incumbent

    def validate(self) -> "TuneSpec":
        """Normalise and check every field (one-line ``ValueError``). fp8: the online variant only; no seeds
        (AMD publishes fp16/bf16 forward configs) and no incumbent (torch's SDPA has no fp8 attention)."""
        self.dtype = normalize_problem_dtype(self.dtype)
        if self.dtype == FP8:
            others = [v for v in (self.variants or ()) if v != "online"]
            if others:
                raise ValueError(f"--variant {' '.join(others)} has no fp8 build; fp8 attention runs the online "
                                 "kernel only (--variant online)")
            self.seeds = self.incumbent = False
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
    (``% 16 == 0``, ``== 1``), so every S divisible by 16 shares one static sweep (4096),
    and on the batch only through the tensors' size (on AMD, storage under 2 GiB is read
    with buffer loads): batch 1 and S 4096, unless the shape's tensors are larger than that
    (then its own sizes).
    """
    from rocmflash.tuning.live_gate import beyond_32bit_range, largest_bytes

    def canon(s):
        return 4096 if s % 16 == 0 else s

    if beyond_32bit_range(largest_bytes(shape)):  # the real sizes decide the pointer attributes: keep them
        return Problem(head_dim=shape.head_dim, dtype=shape.dtype, causal=shape.causal, batch=shape.batch,
                       heads_q=shape.heads_q, heads_kv=shape.heads_kv, seqlen_q=shape.seqlen_q,
                       seqlen_k=shape.seqlen_k)
    return Problem(head_dim=shape.head_dim, dtype=shape.dtype, causal=shape.causal, batch=1,
                   heads_q=shape.heads_q, heads_kv=shape.heads_kv, seqlen_q=canon(shape.seqlen_q),
                   seqlen_k=canon(shape.seqlen_k))
