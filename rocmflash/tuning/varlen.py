"""``rocmflash tune --mode varlen``: tune the packed (variable-length) forward kernel.

``flash_attn_varlen_func`` used to take its forward tile from the *dense* problem's database
entry, but the varlen kernel is its own kernel (lengths read from ``cu_seqlens``, padded head
dims, no two-piece split) over another workload (a grid sized by the longest sequence, programs
of shorter ones returning at once): on an H100, 8 prompts of 4096 ran at 356 TFLOP/s through
it against 451 through the dense kernel on the same tokens. This mode tunes it on its own.

Same shape as the decode tune (:mod:`rocmflash.tuning.decode`): the dense forward's ``online``
knobs for the arch (:func:`rocmflash.static.space.default_space`: BLOCK_M, BLOCK_N, warps, stages,
PRE_LOAD_V and, on AMD, ``waves_per_eu``, MFMA shape, ``kpack``) are cross-compiled for the
target on the CPU as the varlen forward kernel and pruned on compiler truth
(:mod:`rocmflash.static.prune`); only on the live GPU (:mod:`rocmflash.tuning.varlen_worker`,
:mod:`rocmflash.tuning.varlen_run`) is every survivor gated against an fp32 reference on a
packed batch and timed.

The packed batch: ``N`` sequences (query and key lengths equal, as in packed training or the
prefill of many prompts) whose lengths are spread evenly from ``S/8`` to ``S``
(:func:`spread_lengths`), or lengths given one by one. Entries are keyed
``varlen-d{D}-{dtype}-gqa{G}[-causal]-s{bucket}`` (bucket: the next power of two of the
longest sequence) with ``"mode": "varlen"``; forward, backward and decode lookups skip them. At
run time :func:`rocmflash.db.lookups.varlen.lookup_varlen` serves the measured entry of the same head dim, dtype,
GQA ratio and causal flag with the nearest bucket. Without a live GPU of the named kind the static #1 is
written with ``"measured": false`` and never served.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from rocmflash.config import KernelConfig, Problem, normalize_dtype
# the entry keys and the run-time lookup live on the run-time side (rocmflash.db.lookups.varlen); parse_varlen_key
# stays importable from here for benchmarks/varlen.py
from rocmflash.db.lookups.varlen import parse_varlen_key, varlen_key  # noqa: F401
from rocmflash.static.families import FamilyStatic, family_rows

#: the shortest sequence of a spread is the longest divided by this
SPREAD_RATIO = 8


# ----------------------------------------------------------------------------- problem
def spread_lengths(batch: int, seqlen: int) -> tuple:
    """``batch`` sequence lengths evenly spaced from ``seqlen / 8`` to ``seqlen`` (rounded, at least 1).

    Deterministic, so a re-tune measures the same batch: ``(8, 4096)`` -> 512, 1024, ..., 4096;
    one sequence is ``(seqlen,)``. A spread rather than equal lengths because packed batches
    are ragged: the grid is sized by the longest and the shorter ones' programs return early.
    """
    if batch == 1:
        return (seqlen,)
    low = seqlen / SPREAD_RATIO
    return tuple(max(1, round(low + i * (seqlen - low) / (batch - 1))) for i in range(batch))


@dataclasses.dataclass(frozen=True)
class VarlenProblem:
    """One packed forward to tune: sequences of ``lengths`` (queries = keys each), ``heads_q``/``heads_kv``."""

    head_dim: int = 128
    dtype: str = "bf16"
    heads_q: int = 16
    heads_kv: int = 16
    causal: bool = True
    lengths: tuple = spread_lengths(8, 4096)

    @classmethod
    def spread(cls, batch: int, seqlen: int, **fields) -> "VarlenProblem":
        """The problem of ``batch`` sequences spread up to ``seqlen`` (:func:`spread_lengths`), validated."""
        for name, value in (("--batch", batch), ("--seqlen", seqlen)):
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} {value} is invalid; expected an integer >= 1")
        return cls(lengths=spread_lengths(batch, seqlen), **fields).validate()

    @classmethod
    def from_dict(cls, d: dict) -> "VarlenProblem":
        return cls(**dict(d, lengths=tuple(d["lengths"])))

    def validate(self) -> "VarlenProblem":
        if type(self.head_dim) is not int or not 16 <= self.head_dim <= 256:
            raise ValueError(f"--head-dim {self.head_dim} is invalid; expected 16..256")
        if self.heads_q < 1 or self.heads_kv < 1 or self.heads_q % self.heads_kv:
            raise ValueError(f"--heads {self.heads_q} must be a positive multiple of --kv-heads {self.heads_kv}")
        if not self.lengths or any(type(n) is not int or n < 1 for n in self.lengths):
            raise ValueError(f"sequence lengths {list(self.lengths)} are invalid; expected integers >= 1")
        object.__setattr__(self, "dtype", normalize_dtype(self.dtype))
        object.__setattr__(self, "lengths", tuple(self.lengths))
        return self

    @property
    def group(self) -> int:
        return self.heads_q // self.heads_kv

    @property
    def max_seqlen(self) -> int:
        return max(self.lengths)

    def to_dict(self) -> dict:
        return dict(dataclasses.asdict(self), lengths=list(self.lengths))

    def compile_dict(self) -> dict:
        """What a compile depends on (the compile cache key): lengths and batch are runtime values, except
        that a packed batch whose largest tensor (``q``: ``T x Hq x D``) is past the 2 GiB line adds its
        token count ``"tokens"`` (on AMD such tensors are read with global loads, not buffer loads: another
        build, and another cache entry); under it every batch shares one build."""
        from rocmflash.tuning.live_gate import build_bytes

        out = {"head_dim": self.head_dim, "dtype": self.dtype, "group": self.group, "heads_kv": self.heads_kv,
               "causal": self.causal}
        if build_bytes(2 * sum(self.lengths) * self.heads_q * self.head_dim):
            out["tokens"] = sum(self.lengths)
        return out

    def key(self) -> str:
        return varlen_key(self.head_dim, self.dtype, self.group, self.causal, self.max_seqlen)

    def flops(self) -> float:
        """Matmul FLOPs of the forward: ``4 * D * Hq`` per visible (query, key) pair of every sequence."""
        pairs = sum(n * (n + 1) // 2 if self.causal else n * n for n in self.lengths)
        return 4.0 * self.head_dim * self.heads_q * pairs

    def dense_problem(self) -> Problem:
        """The dense :class:`Problem` of the longest sequence (what the space's restrictions read)."""
        return Problem(head_dim=self.head_dim, dtype=self.dtype, causal=self.causal, heads_q=self.heads_q,
                       heads_kv=self.heads_kv, seqlen_q=self.max_seqlen, seqlen_k=self.max_seqlen)


# ----------------------------------------------------------------------------- space and compile
def varlen_space(gpu, problem: VarlenProblem) -> list:
    """The varlen forward's configs for ``gpu``: the dense ``online`` space (same knobs and restrictions),
    as KernelConfig dicts. The varlen kernel takes every knob of it (tiles, warps, stages, PRE_LOAD_V and
    AMD's compile options); it has no other variant, no ``num_splits`` and always pads the head dim."""
    from rocmflash.static.space import default_space

    return [cfg.to_dict() for cfg in default_space(gpu, ["online"]).configs(problem.dense_problem(), gpu)]


def config_label(cfg: dict) -> str:
    """``128x64 w4 s1 wpe2 m16 k1 pv``: tile, warps, stages, then the knobs that are set."""
    text = f"{cfg['BLOCK_M']}x{cfg['BLOCK_N']} w{cfg['num_warps']} s{cfg['num_stages']}"
    if cfg.get("waves_per_eu"):
        text += f" wpe{cfg['waves_per_eu']}"
    if cfg.get("matrix_instr_nonkdim"):
        text += f" m{cfg['matrix_instr_nonkdim']} k{cfg.get('kpack', 1)}"
    return text + (" pv" if cfg.get("PRE_LOAD_V") else "")


def task_compile_options(config: dict, backend: str) -> dict:
    return KernelConfig.from_dict(config).compile_options(backend)


def compile_task(target, config: dict, problem: dict):
    """Family entry for :func:`rocmflash.static.compile.sweep_family`: the varlen forward kernel for ``target``
    (``problem``: :meth:`VarlenProblem.compile_dict`; its ``tokens``, when there, size the tensors)."""
    from rocmflash.kernels.varlen.host import compile_forward_for

    return (compile_forward_for(target, KernelConfig.from_dict(config), problem["head_dim"], problem["dtype"],
                                problem["group"], problem["causal"], problem["heads_kv"],
                                total_tokens=problem.get("tokens", 0)),)


def _static_key(config: dict, obs: dict, index: int) -> tuple:
    """The dense forward's static score (:func:`rocmflash.tuning.static.static_key`) of a varlen config."""
    from rocmflash.tuning.static import static_key

    return static_key(KernelConfig.from_dict(config), obs, index)


def static_phase(gpu, problem: VarlenProblem, cache_dir=None, workers=None, settings=None,
                 configs: Optional[list] = None) -> FamilyStatic:
    """Cross-compile the varlen space for ``gpu``'s arch, prune, rank by the dense forward's static score."""
    from rocmflash.static.compile import sweep_family
    from rocmflash.static.prune import PruneSettings, prune

    configs = configs if configs is not None else varlen_space(gpu, problem)
    observations, stats = sweep_family("varlen", configs, problem.compile_dict(), gpu, cache_dir, workers)
    rows = family_rows(configs, observations, prune(observations, settings or PruneSettings()), _static_key)
    return FamilyStatic(problem, rows, stats)


# ----------------------------------------------------------------------------- run-time lookup


__all__ = ["VarlenProblem", "spread_lengths", "varlen_key", "varlen_space", "config_label", "static_phase"]
