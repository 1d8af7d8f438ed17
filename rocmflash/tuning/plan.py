"""A model tune's plan: every attention problem a model calls, the configs each has, and a time estimate.

A model (:mod:`rocmflash.tuning.models`) calls, per dtype and sequence-length bucket:

* the causal prefill **forward** (database key ``d<D>-<dtype>-causal-gqa<r>-s<bucket>``),
* its **backward** (``bwd-<forward key>``; training), and
* the KV-cache **decode** step (``decode-d<D>-<dtype>-gqa<r>-kv<bucket>-b<batch bucket>``).

Sliding-window and soft-capped layers run on the varlen kernels, which read the same
forward and backward entries (the backward's after a check that they build as the varlen
kernels with the cap and window); they are not tuned separately, and the plan says so.

The estimate is rough by design: live seconds per timed config measured on an H100
(``SECONDS_PER_CONFIG``), divided over the GPUs, plus a cross-compile estimate for configs
not yet in the compile cache. After a tune, the summary shows the real figure beside it.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from rocmflash.config import Problem, normalize_dtype
from rocmflash.tuning.models import ModelAttention

#: default sequence-length buckets of a model tune (capped by the model's context length)
DEFAULT_SEQLENS = (1024, 2048, 4096, 8192, 16384, 32768)
#: default decode batch of a model tune
DEFAULT_DECODE_BATCH = 32
#: live seconds per config in the space, per pass, from H100 tunes: forward race 42-56 s for an
#: 84-config space (docs/evidence/race-heldout-2026-11-23-h100.md), backward 48-75 s for 36-45
#: configs per kernel (docs/evidence/bwd-tune-2026-11-24-h100.md), decode ~0.6 s per survivor
SECONDS_PER_CONFIG = {"fwd": 0.6, "bwd": 0.8, "decode": 0.6}
#: CPU seconds to cross-compile one config on one core, nothing cached (Triton 3.6 on this project's 2-core
#: CI box: 84 D=64 forward configs in 23 s, 60 decode configs in 16 s)
COMPILE_SECONDS = 1.1
KINDS = ("fwd", "bwd", "decode")


@dataclasses.dataclass(frozen=True)
class PlannedProblem:
    """One problem of a plan: its kind, database key, dtype, sequence length and space size."""

    kind: str  #: fwd, bwd or decode
    key: str
    dtype: str
    seqlen: int
    configs: int  #: configs in its space (before pruning)

    @property
    def live_seconds(self) -> float:
        return self.configs * SECONDS_PER_CONFIG[self.kind]


@dataclasses.dataclass
class TunePlan:
    """What ``rocmflash tune --model`` will do; :func:`make_plan` builds it."""

    model: ModelAttention
    gpu: object  #: rocmflash.hw.gpus.GPU
    dtypes: list
    seqlens: list
    passes: tuple  #: ("fwd",), ("bwd",) or ("fwd", "bwd"); () for decode only
    decode: bool
    decode_batch: int
    problems: list
    dropped_seqlens: list  #: asked for but beyond the model's context length
    notes: list

    def count(self, kind: str) -> int:
        return sum(p.kind == kind for p in self.problems)

    def configs(self, kind: Optional[str] = None) -> int:
        return sum(p.configs for p in self.problems if kind is None or p.kind == kind)

    def estimate_seconds(self, n_gpus: int, cpu_cores: int, compile_cached: bool = False) -> dict:
        """``{"static", "live", "total"}`` seconds: compile on every core, live timing over ``n_gpus``."""
        # one static sweep per (pass, dtype): the sequence lengths share it (Triton specialises on % 16 only)
        firsts = {(p.kind, p.dtype): p.configs for p in reversed(self.problems)}
        static_configs = sum(firsts.values())
        static = 0.0 if compile_cached else static_configs * COMPILE_SECONDS / max(1, cpu_cores)
        live = sum(p.live_seconds for p in self.problems) / max(1, n_gpus)
        return {"static": static, "live": live, "total": static + live}


def _seqlens(model: ModelAttention, asked: Optional[list]) -> tuple[list, list]:
    seqlens = list(dict.fromkeys(asked or DEFAULT_SEQLENS))
    for s in seqlens:
        if type(s) is not int or s < 1:
            raise ValueError(f"--seqlen {s!r} is invalid; expected a positive int")
    if asked or not model.max_positions:
        return seqlens, []
    return [s for s in seqlens if s <= model.max_positions], [s for s in seqlens if s > model.max_positions]


def make_plan(model: ModelAttention, gpu, dtypes: Optional[list] = None, seqlens: Optional[list] = None,
              passes: tuple = ("fwd", "bwd"), decode: bool = True, decode_batch: Optional[int] = None,
              variants: Optional[list] = None) -> TunePlan:
    """Every problem ``model`` calls on ``gpu``: causal prefill forward/backward per dtype and bucket, and
    decode per dtype and KV-length bucket. Default dtypes: both fp16 and bf16; default buckets
    :data:`DEFAULT_SEQLENS` up to the model's context length."""
    from rocmflash.db import problem_key, seqlen_bucket
    from rocmflash.static.space import default_space
    from rocmflash.tuning.backward import bwd_space
    from rocmflash.tuning.decode import DecodeProblem, decode_space

    if not 16 <= model.head_dim <= 256:
        raise ValueError(f"{model.name}: head dim {model.head_dim} is outside rocmflash's 16..256")
    dtypes = [normalize_dtype(d) for d in dict.fromkeys(dtypes or ("fp16", "bf16"))]
    lens, dropped = _seqlens(model, seqlens)
    if not lens:
        raise ValueError(f"{model.name}: every --seqlen is beyond its context length {model.max_positions}")
    batch = decode_batch or DEFAULT_DECODE_BATCH
    if type(batch) is not int or batch < 1:
        raise ValueError(f"--batch {batch!r} is invalid; expected a positive int")
    problems = []
    space = default_space(gpu, variants)
    n_bwd = len(bwd_space(gpu.arch, model.head_dim))
    n_decode = len(decode_space(gpu.arch))
    for dtype in dtypes:
        sample = Problem(head_dim=model.head_dim, dtype=dtype, causal=True, batch=1, heads_q=model.heads_q,
                         heads_kv=model.heads_kv, seqlen_q=4096, seqlen_k=4096)
        n_fwd = len(space.configs(sample, gpu))
        for s in lens:
            key = problem_key(model.head_dim, dtype, True, model.gqa_ratio, seqlen_bucket(s))
            if "fwd" in passes:
                problems.append(PlannedProblem("fwd", key, dtype, s, n_fwd))
            if "bwd" in passes:
                problems.append(PlannedProblem("bwd", "bwd-" + key, dtype, s, n_bwd))
        if decode:
            for s in lens:
                dp = DecodeProblem(head_dim=model.head_dim, dtype=dtype, heads_q=model.heads_q,
                                   heads_kv=model.heads_kv, batch=batch, seqlen_k=s).validate()
                problems.append(PlannedProblem("decode", dp.key(), dtype, s, n_decode))
    notes = []
    if model.sliding_window or model.softcap:
        what = " and ".join(filter(None, (f"a {model.sliding_window}-key sliding window" if model.sliding_window
                                          else "", f"softcap {model.softcap:g}" if model.softcap else "")))
        notes.append(f"layers with {what} run on the varlen kernels, which read the same causal forward and "
                     "backward entries; they are not tuned separately")
    if dropped:
        notes.append(f"seqlen buckets {', '.join(map(str, dropped))} are beyond {model.name}'s context length "
                     f"{model.max_positions}: left out (name them with --seqlen to tune them anyway)")
    return TunePlan(model, gpu, dtypes, lens, tuple(passes), decode, batch, problems, dropped, notes)


def plan_table(plan: TunePlan, n_gpus: int, cpu_cores: int, measuring: bool, where: str):
    """A rich renderable: one row per pass (problems x configs), the estimate and the notes."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"rocmflash tune plan: {plan.model.describe()} on {plan.gpu.name} ({plan.gpu.arch})")
    for col in ("pass", "problems", "configs each", "configs in all", "keys"):
        table.add_column(col)
    names = {"fwd": "forward (causal prefill)", "bwd": "backward (dQ, dK/dV)", "decode": "decode (KV cache)"}
    for kind in KINDS:
        probs = [p for p in plan.problems if p.kind == kind]
        if not probs:
            continue
        each = sorted({p.configs for p in probs})
        keys = probs[0].key + (f" ... {probs[-1].key}" if len(probs) > 1 else "")
        table.add_row(names[kind], str(len(probs)), "/".join(map(str, each)), str(sum(p.configs for p in probs)),
                      keys)
    est = plan.estimate_seconds(n_gpus, cpu_cores)
    lines = [f"dtypes {', '.join(plan.dtypes)}; seqlen buckets {', '.join(map(str, plan.seqlens))}"
             + (f"; decode batch {plan.decode_batch}" if plan.decode else "")]
    if measuring:
        lines.append(f"estimated time: ~{_duration(est['total'])} ({_duration(est['static'])} cross-compiling on "
                     f"{cpu_cores} CPU core(s) if nothing is cached, ~{_duration(est['live'])} timing on {where}; "
                     "rough: from H100 tunes)")
    else:
        lines.append(f"static phase only ({where}): ~{_duration(est['static'])} cross-compiling on {cpu_cores} CPU "
                     "core(s) if nothing is cached; nothing is timed")
    lines += [f"note: {n}" for n in plan.notes]
    return Group(table, *[Text(line) for line in lines])


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 90:
        return f"{seconds} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


__all__ = ["DEFAULT_SEQLENS", "DEFAULT_DECODE_BATCH", "SECONDS_PER_CONFIG", "PlannedProblem", "TunePlan",
           "make_plan", "plan_table"]
