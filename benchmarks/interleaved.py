"""Timing and table helpers shared by the public-API benchmarks run as ``python bench/<name>.py``.

``host_and_wall_us`` times ``n`` back-to-back calls by the host clock: enqueue time and wall time per call.
``interleaved_medians`` times every path back to back between two CUDA events, path after path in
each round (so drift hits all paths alike), and returns the median per path in µs.
``capture_graph`` captures calls into a CUDA/HIP graph for GPU-time-only paths.
``MarkdownTable`` rewrites its file after every row group, so a killed run keeps what it measured.
``gpu_table_head`` checks for a GPU and starts a report: title, device, versions, command, notes, columns.
``grid_parser``, ``chosen_cases`` and ``run_meta``: the grid benchmarks' options, case subset and report header.
"""

from __future__ import annotations

import datetime
import statistics
import sys
import time


def back_to_back_us(torch, fn, n: int) -> float:
    """µs per call of ``n`` back-to-back calls of ``fn`` (after one warm-up call), by CUDA events (the tuner's
    own timer, ``rocmflash.tuning.live_worker.events_ms``)."""
    from rocmflash.tuning.live_worker import events_ms

    fn()
    torch.cuda.synchronize()
    return events_ms([fn], n) * 1e3


def host_and_wall_us(torch, run, n: int) -> tuple:
    """``(host µs per call, wall µs per call)`` of ``n`` back-to-back calls of ``run``: the host clock from a synchronised
    start to the last call's return (what enqueueing costs), and to the GPU's end (synchronised again)."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        run()
    enqueued = time.perf_counter()
    torch.cuda.synchronize()
    end = time.perf_counter()
    return (enqueued - start) / n * 1e6, (end - start) / n * 1e6


def capture_graph(torch, fn, calls: int = 1, warmup: int = 1):
    """``calls`` calls of ``fn`` captured into one CUDA/HIP graph (after ``warmup`` calls on a side
    stream); returns the graph's ``replay`` (``rocmflash.tuning.isolated.capture_graph``)."""
    from rocmflash.tuning.isolated import capture_graph as capture

    return capture([fn], calls, warmup)


def interleaved_medians(torch, paths: dict, rounds: int, iters: int) -> dict:
    """``{path: median µs per call}`` over ``rounds`` interleaved rounds of ``iters`` calls each."""
    times = {p: [] for p in paths}
    for _ in range(rounds):
        for p, fn in paths.items():
            times[p].append(back_to_back_us(torch, fn, iters))
    return {p: statistics.median(t) for p, t in times.items()}


def kernel_device_us(torch, fn, calls: int = 30) -> dict:
    """Device µs per launch of each kernel ``fn`` runs (torch's profiler, eager calls): where a config's time goes."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    out = {}
    for evt in prof.key_averages():
        t = getattr(evt, "device_time", None) or getattr(evt, "cuda_time", 0.0)
        if evt.count:
            out[evt.key[:40]] = round(float(t), 2)
    return out


class MarkdownTable:
    """A header, table rows and ``tail`` lines (after a blank line) written to ``path``; :meth:`flush`
    rewrites the whole file."""

    def __init__(self, path: str, head: list):
        self.path, self.head, self.rows, self.tail = path, list(head), [], []
        self.flush()

    def add(self, row: str) -> None:
        self.rows.append(row)
        print(row, flush=True)

    def flush(self) -> None:
        with open(self.path, "w") as f:
            f.write("\n".join(self.head + self.rows + ([""] + self.tail if self.tail else [])) + "\n")


def gpu_table_head(torch, script: str, title: str, note: str, columns: list) -> list:
    """The first lines of a benchmark's markdown table (title with today's date, device, torch and Triton
    versions, the exact command, ``note``, the column header), or None with a message when no GPU is visible."""
    import triton

    if not torch.cuda.is_available():
        print(f"bench/{script} needs a GPU", file=sys.stderr)
        return None
    return [f"# {title} ({datetime.date.today()})", "",
            f"- device: {torch.cuda.get_device_name()}; torch {torch.__version__}; triton {triton.__version__}",
            f"- command: `python {' '.join(sys.argv)}`", f"- {note}", "",
            "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]


def grid_parser(doc: str):
    """The grid benchmarks' shared options: ``--rounds``, ``--cases`` (a subset of the grid's case names),
    ``--label``, ``--commit`` (the rocmflash commit measured, for the report header) and ``--out``."""
    import argparse

    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cases", default="", help="comma-separated subset of the grid's case names")
    ap.add_argument("--label", default="gpu")
    ap.add_argument("--commit", default="", help="the rocmflash commit measured (for the report header)")
    ap.add_argument("--out", default=".")
    return ap


def chosen_cases(ap, grid: dict, cases: str) -> dict:
    """The cases of ``grid`` that ``--cases`` names (all when empty); an unknown name is the parser's error."""
    if not cases:
        return grid
    wanted = [c.strip() for c in cases.split(",") if c.strip()]
    unknown = [c for c in wanted if c not in grid]
    if unknown:
        ap.error(f"unknown case(s) {unknown}; known: {list(grid)}")
    return {c: grid[c] for c in wanted}


def run_meta(torch, args, script: str, argv=None) -> dict:
    """A grid report's header: label, date, device, torch and Triton versions, commit, rounds, the exact command."""
    import triton

    return {"label": args.label, "date": datetime.date.today().isoformat(), "device": torch.cuda.get_device_name(0),
            "torch": torch.__version__, "triton": triton.__version__, "commit": args.commit or "working tree",
            "rounds": args.rounds,
            "command": f"python benchmarks/{script} " + " ".join(sys.argv[1:] if argv is None else argv)}
