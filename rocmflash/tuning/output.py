"""Console output of a tune, an observer of its progress: static bar, timing bar, final table."""

from __future__ import annotations

import sys
from typing import Optional

from rocmflash.static.seeds import reference_seeds
from rocmflash.tuning.static import StaticResult, static_phase


class _Output:
    """Rich progress (static sweep bar, timing bar with ETA and best-so-far) or nothing."""

    def __init__(self, console, progress: bool):
        self.console = console
        self.progress = progress and console is not None
        self.live = None  #: the one shared progress display of a parallel live phase (:meth:`shared`)

    def note(self, text: str) -> None:
        if self.console is not None:
            self.console.print(text, highlight=False)

    def shared(self, pool, problems: int):
        """Context: one progress display for a parallel live phase -- a row per problem round (done, ETA,
        best so far) and a row per worker (configs timed, busy share, what it times now)."""
        import contextlib

        if not self.progress:
            return contextlib.nullcontext()
        return _SharedProgress(self, pool, problems)

    def problem_done(self, outcome) -> None:
        """A problem's entry is written (parallel runs say so; the serial bars already did)."""
        if self.live is not None and outcome.entry:
            e = outcome.entry
            best = _label(e["best"]) + f" {e['tflops']:.1f} TFLOP/s" if e.get("best") and e.get("tflops") else "-"
            self.note(f"done {outcome.key}: best {best} ({outcome.seconds:.0f} s)")

    def static(self, gpu, problem, space, spec, on_result=None, on_configs=None) -> StaticResult:
        """The static phase with its progress display; ``on_result(observation)``: each compile result as it
        arrives; ``on_configs(configs, seed_of)``: what is compiled, before it is (a streamed static phase)."""
        seeds = tuple(reference_seeds(gpu, problem, spec.variants)) if spec.seeds else ()
        if on_configs is not None:
            from rocmflash.tuning.static import static_configs

            on_configs(*static_configs(gpu, problem, space, seeds))
        tick = on_result or (lambda _: None)
        if seeds:
            self.note(f"seeds: {len(seeds)} AMD-published {gpu.arch} config(s) always timed: "
                      + ", ".join(ref_id for ref_id, _ in seeds))
        n = len(space.configs(problem, gpu)) + len(seeds)
        if not self.progress:
            return static_phase(gpu, problem, space, spec.cache_dir, spec.workers, spec.prune_settings, seeds=seeds,
                                on_result=on_result)
        if self.live is not None:  # a pipeline's one display: a row while the sweep runs beside the timing
            with _SharedBar(self.live, f"static sweep for {gpu.arch} {problem.dtype}", n, 0, None) as row:
                st = static_phase(gpu, problem, space, spec.cache_dir, spec.workers, spec.prune_settings,
                                  on_result=lambda r: (row.tick(), tick(r)), seeds=seeds)
        else:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            with Progress(TextColumn(f"[bold]static sweep for {gpu.arch}"), BarColumn(), MofNCompleteColumn(),
                          TimeElapsedColumn(), console=self.console, transient=True) as bar:
                task = bar.add_task("static", total=n)
                st = static_phase(gpu, problem, space, spec.cache_dir, spec.workers, spec.prune_settings,
                                  on_result=lambda r: (bar.advance(task), tick(r)), seeds=seeds)
        s = st.stats
        kept = sum(c.kept for c in st.candidates)
        self.note(f"static phase D={problem.head_dim} {problem.dtype}{' causal' if problem.causal else ''}: "
                  f"{s.configs} configs ({s.compiled} compiled, {s.cache_hits} cached, {s.failed} failed) in "
                  f"{s.seconds:.1f} s; {kept} survive the pruner")
        return st

    def spinner(self, text: str):
        import contextlib

        if not self.progress or self.live is not None:  # one live display at a time
            return contextlib.nullcontext()
        return self.console.status(text)

    def bar(self, key: str, total: int, done: int, best: Optional[float]):
        if self.live is not None:
            return _SharedBar(self.live, key, total, done, best)
        return _Bar(self, key, total, done, best)


class _SharedProgress:
    """The live display of a parallel live phase (see :meth:`_Output.shared`)."""

    def __init__(self, out: _Output, pool, problems: int):
        self.out, self.pool = out, pool
        self.started = None

    def __enter__(self):
        import time

        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                                   TimeRemainingColumn)

        self.started = time.perf_counter()
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                                 TextColumn("{task.fields[info]}"), console=self.out.console)
        self.progress.__enter__()
        self.workers = [self.progress.add_task(f"[cyan]{s.label}", total=None, info="") for s in self.pool.stats]
        self.out.live = self
        return self

    def refresh_workers(self) -> None:
        import time

        elapsed = max(1e-9, time.perf_counter() - self.started)
        for task, s in zip(self.workers, self.pool.stats):
            state = "LOST" if s.lost else (f"timing {s.current}" if s.current else "idle")
            self.progress.update(task, completed=s.done, info=f"{100 * s.busy_s / elapsed:.0f}% busy, {state}")

    def __exit__(self, *exc):
        self.out.live = None
        self.refresh_workers()
        self.progress.__exit__(*exc)
        return False


class _SharedBar:
    """One problem round's row in the shared display (removed when the round ends)."""

    def __init__(self, shared: _SharedProgress, key: str, total: int, done: int, best):
        self.shared, self.key, self.total, self.done, self.best = shared, key, total, done, best

    def __enter__(self):
        self.task = self.shared.progress.add_task(f"[bold]{self.key}", total=self.total, completed=self.done,
                                                  info=_best_text(self.best))
        return self

    def advance(self, best, record: dict) -> None:
        self.best = best
        progress = self.shared.progress
        progress.update(self.task, advance=1, info=_best_text(best))
        self.shared.refresh_workers()
        if record["status"] != "ok":
            progress.console.print(f"  {record['status']} ({record.get('worker')}): {_label(record['config'])}: "
                                   f"{(record.get('error') or '')[:160]}", highlight=False)

    def tick(self) -> None:
        """One more done, no result record (a static sweep's compile)."""
        self.shared.progress.update(self.task, advance=1)

    def __exit__(self, *exc):
        self.shared.progress.remove_task(self.task)
        return False


def _best_text(best) -> str:
    return "best: -" if best is None else f"best: {best:.1f} TFLOP/s"


class _Bar:
    def __init__(self, out: _Output, key: str, total: int, done: int, best):
        self.out, self.key, self.total, self.done, self.best = out, key, total, done, best
        self.progress = None

    def __enter__(self):
        if self.out.progress:
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                                       TimeRemainingColumn)

            self.progress = Progress(TextColumn(f"[bold]{self.key}"), BarColumn(), MofNCompleteColumn(),
                                     TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                                     TextColumn("{task.fields[best]}"), console=self.out.console)
            self.progress.__enter__()
            self.task = self.progress.add_task(self.key, total=self.total, completed=self.done,
                                               best=self._best_text())
        return self

    def _best_text(self) -> str:
        return "best: -" if self.best is None else f"best: {self.best:.1f} TFLOP/s"

    def advance(self, best, record: dict) -> None:
        self.best = best
        if self.progress is not None:
            self.progress.update(self.task, advance=1, best=self._best_text())
            if record["status"] != "ok":
                self.progress.console.print(f"  {record['status']}: {_label(record['config'])}: "
                                            f"{(record.get('error') or '')[:160]}", highlight=False)

    def __exit__(self, *exc):
        if self.progress is not None:
            self.progress.__exit__(*exc)
        return False


def _label(cfg: dict) -> str:
    c = cfg
    parts = [c["variant"], f"{c['BLOCK_M']}x{c['BLOCK_N']}", f"w{c['num_warps']}", f"s{c['num_stages']}"]
    if c.get("waves_per_eu"):
        parts.append(f"wpe{c['waves_per_eu']}")
    if c.get("matrix_instr_nonkdim"):
        parts.append(f"mfma{c['matrix_instr_nonkdim']}")
    if c.get("kpack", 1) != 1:
        parts.append(f"kp{c['kpack']}")
    if c.get("PRE_LOAD_V"):
        parts.append("plv")
    if c["variant"] == "split_d":
        parts.append(f"c{c['d_chunks']}")
    return " ".join(parts)


def print_summary(result, console) -> None:
    """The final table of a :class:`~rocmflash.tuning.run.TuneResult`: winners beside their roofline floor and
    the efficiency reached."""
    from rich.table import Table

    title = f"rocmflash tune: {result.gpu.name} ({result.gpu.arch}) -> {result.db_path}"
    table = Table(title=title)
    for col in ("problem", "B x H", "measured", "best config", "TFLOP/s", "ms", "floor ms (compute / memory)",
                "efficiency", "timed / space"):
        table.add_column(col)
    for o in result.outcomes:
        e = o.entry
        if not e:
            continue
        roof = e["roofline"]
        floor = f"{roof['floor_ms']:.3f} ({roof['compute_ms']:.3f} / {roof['memory_ms']:.3f})"
        counts = e["counts"]
        table.add_row(o.key, f"{o.shape.batch} x {o.shape.heads_q}/{o.shape.heads_kv}",
                      "FAILED" if e.get("failed") else "yes" if e["measured"] else "NO (static rank)",
                      _label(e["best"]) if e.get("best") else "-",
                      f"{e['tflops']:.1f}" if e.get("tflops") else "-",
                      f"{e['time_ms']:.3f}" if e.get("time_ms") else "-", floor,
                      f"{100 * e['efficiency']:.0f}%" if e.get("efficiency") else "-",
                      f"{counts['timed']} / {counts['space']}"
                      + (" (rounds " + " > ".join(map(str, counts["rounds"])) + ")" if counts.get("rounds") else ""))
    console.print(table)
    if not result.measured:
        console.print(f"[bold]Nothing was benchmarked[/bold]: {result.why_unmeasured}. The static ranking was "
                      f"written to {result.db_path} with \"measured\": false.", highlight=False)
    else:
        timed = sum(o.timed_now for o in result.outcomes)
        skipped = sum(o.skipped for o in result.outcomes)
        console.print(f"timed {timed} config(s) this run (race rounds count once each), reused {skipped} "
                      f"from {result.journal_path}; "
                      f"{result.seconds:.1f} s in all", highlight=False)
        stale = sum(o.stale for o in result.outcomes)
        if stale:
            console.print(f"ignored {stale} journal result(s) made under another environment (Triton/torch/device)",
                          highlight=False)


def log(*a) -> None:  # pragma: no cover - debugging aid
    print(*a, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------- the pipeline trace
#: set to a file path, every pipeline event of a tune (static phases, jobs, workers, on the wall clock since the
#: pipeline started) is appended to it as JSON lines: the per-worker timeline of a run (benchmarks/scale_gpus.py)
TRACE_ENV = "ROCMFLASH_PIPELINE_TRACE"


def trace_mark(name: str) -> None:
    """Append ``{"event": "mark", "name": name, "wall": time.time()}`` to ``$ROCMFLASH_PIPELINE_TRACE`` (no-op
    unset): where a tune process spends its time outside the pipeline (start-up, workers, saving, closing), on
    the wall clock a caller that started the process can subtract from (benchmarks/scale_gpus.py)."""
    import os
    import time

    path = os.environ.get(TRACE_ENV)
    if path:
        trace = _Trace.open()
        trace({"event": "mark", "name": name, "wall": time.time()})
        trace.close()


class _Trace:
    """The pipeline's events as JSON lines in ``$ROCMFLASH_PIPELINE_TRACE`` (see :data:`TRACE_ENV`)."""

    def __init__(self, f):
        self.f = f

    @classmethod
    def open(cls):
        import os

        path = os.environ.get(TRACE_ENV)
        if not path:
            return None
        try:
            return cls(open(path, "a", encoding="utf-8"))
        except OSError as err:
            raise ValueError(f"${TRACE_ENV}={path}: cannot write it ({err})") from None

    def __call__(self, event: dict) -> None:
        import json

        self.f.write(json.dumps(event, default=str) + "\n")

    def close(self) -> None:
        self.f.close()
