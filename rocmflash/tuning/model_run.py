"""``rocmflash tune --model``: every attention problem of a model, on one GPU, every GPU of a node, or a cluster.

The plan (:mod:`rocmflash.tuning.plan`) is run pass by pass, per dtype: the forward tune
(:func:`rocmflash.tuning.run.tune`: its problems run in parallel over the pool's GPUs and
each race round spreads its configs over them), then the backward
(:func:`~rocmflash.tuning.backward_run.tune_backward`) and decode
(:func:`~rocmflash.tuning.decode_run.tune_decode`) tunes, whose configs spread over the
pool. Everything lands in the one database (and the forward's journal), with the
guarantees a single-GPU tune has.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Optional

from rocmflash.tuning.plan import TunePlan


@dataclasses.dataclass
class ModelTuneResult:
    plan: TunePlan
    db_path: Optional[str]
    measured: bool
    why_unmeasured: Optional[str]
    forward: list  #: TuneResult per dtype
    backward: list  #: BwdTuneResult per dtype
    decode: list  #: FamilyTuneResult per decode problem
    seconds: float
    workers: list  #: WorkerStats of the pool (empty on one GPU without a pool)


def tune_model(plan: TunePlan, pool=None, db_path: Optional[str] = None, strategy: str = "race",
               cache_dir: Optional[str] = None, workers: Optional[int] = None, timeout_s: float = 120.0,
               seeds: bool = True, resume: bool = False, console=None, progress: bool = True,
               on_stage=None) -> ModelTuneResult:
    """Run ``plan``; ``pool`` (a :class:`~rocmflash.tuning.pool.WorkerPool`) times on its workers,
    None times on the current device when it is the plan's GPU (else the static phase only)."""
    from rocmflash.live import LiveSettings
    from rocmflash.tuning.backward_run import tune_backward
    from rocmflash.tuning.decode import DecodeProblem
    from rocmflash.tuning.decode_run import tune_decode
    from rocmflash.tuning.run import tune
    from rocmflash.tuning.spec import TuneSpec

    start = time.perf_counter()
    model, gpu = plan.model, plan.gpu
    forward, backward, decode = [], [], []
    say = on_stage or (lambda text: console.print(text, highlight=False) if console is not None else None)
    for dtype in plan.dtypes:
        spec = TuneSpec(gpu=gpu.name, head_dim=model.head_dim, dtype=dtype, seqlens=list(plan.seqlens), causal=True,
                        heads=model.heads_q, kv_heads=model.heads_kv, strategy=strategy, db_path=db_path,
                        resume=resume, cache_dir=cache_dir, workers=workers, seeds=seeds,
                        live_settings=LiveSettings(timeout_s=timeout_s)).validate()
        if "fwd" in plan.passes:
            say(f"[bold]forward[/bold] {model.name} {dtype}: {len(plan.seqlens)} problem(s)")
            forward.append(tune(spec, runner=pool, console=console, progress=progress))
        if "bwd" in plan.passes:
            say(f"[bold]backward[/bold] {model.name} {dtype}: {len(plan.seqlens)} problem(s)")
            backward.append(tune_backward(spec, console=console, pool=pool))
        if plan.decode:
            for s in plan.seqlens:
                problem = DecodeProblem(head_dim=model.head_dim, dtype=dtype, heads_q=model.heads_q,
                                        heads_kv=model.heads_kv, batch=plan.decode_batch, seqlen_k=s).validate()
                say(f"[bold]decode[/bold] {problem.key()}")
                decode.append(tune_decode(gpu.name, problem, db_path, cache_dir, workers, timeout_s, pool=pool))
    results = forward + backward + decode
    measured = any(r.measured for r in results)
    why = next((r.why_unmeasured for r in results if r.why_unmeasured), None)
    path = next((r.db_path for r in results), db_path)
    return ModelTuneResult(plan, path, measured, None if measured else why, forward, backward, decode,
                           time.perf_counter() - start, list(pool.stats) if pool is not None else [])


def print_model_summary(result: ModelTuneResult, console, n_gpus: int, cpu_cores: int) -> None:
    """One row per problem (pass, key, best config, time, measured) and the wall time against the plan."""
    from rich.table import Table

    from rocmflash.tuning.output import _label

    plan = result.plan
    table = Table(title=f"rocmflash tune --model {plan.model.name}: {plan.gpu.name} -> {result.db_path}")
    for col in ("pass", "key", "measured", "best config", "time", "timed"):
        table.add_column(col)
    for r in result.forward:
        for o in r.outcomes:
            e = o.entry or {}
            table.add_row("fwd", o.key, "yes" if e.get("measured") else "no",
                          _label(e["best"]) if e.get("best") else "-",
                          f"{e['time_ms']:.3f} ms" if e.get("time_ms") else "-",
                          str((e.get("counts") or {}).get("timed", "-")))
    for r in result.backward:
        for o in r.outcomes:
            e = o.entry or {}
            best = e.get("best") or {}
            text = " + ".join(f"{k} {v['BLOCK_M']}x{v['BLOCK_N']} w{v['num_warps']}" for k, v in best.items()
                              if isinstance(v, dict) and "BLOCK_M" in v)
            table.add_row("bwd", o.key, "yes" if e.get("measured") else "no", text or "-",
                          f"{e['time_ms']['total']:.3f} ms" if e.get("time_ms") else "-",
                          str((e.get("counts") or {}).get("timed", "-")))
    for r in result.decode:
        e = r.entry or {}
        best = e.get("best") or {}
        text = (f"n{best['BLOCK_N']} w{best['num_warps']} s{best['num_stages']} splits {best.get('num_splits')}"
                if best else "-")
        table.add_row("decode", r.key, "yes" if e.get("measured") else "no", text,
                      f"{1e3 * e['time_ms']:.1f} µs" if e.get("time_ms") else "-",
                      str((e.get("counts") or {}).get("timed", "-")))
    console.print(table)
    est = plan.estimate_seconds(n_gpus, cpu_cores)
    what = "total" if result.measured else "static"
    console.print(f"wall time {result.seconds:.0f} s (plan estimate ~{est[what]:.0f} s, if nothing was cached)",
                  highlight=False)
    for s in result.workers:
        console.print(f"  worker {s.label}: {s.done} timed ({s.failed} not ok), busy {s.busy_s:.0f} s"
                      + (", LOST" if s.lost else ""), highlight=False)
    if not result.measured:
        console.print(f"nothing was timed: {result.why_unmeasured}; entries are static rankings "
                      "(\"measured\": false)", highlight=False)


__all__ = ["ModelTuneResult", "tune_model", "print_model_summary"]
