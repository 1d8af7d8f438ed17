"""THE numeric gate and the timers of every tune: a config must compute attention before it is timed.

The acceptance rule (:func:`gate`), one for all six timing paths (forward, decode, backward, varlen,
varlen backward, and the incumbent beside the winner). Each family supplies only its inputs, its launch
and its fp32 reference (``rocmflash.tuning.<family>``); the rule is here:

1. every output buffer the launch writes is **poisoned with NaN** first, so an element a tile skips stays NaN;
2. after the launch every element of every output must be **finite** (an unwritten or overflowed element fails);
3. the **relative L2 error** ``||out - ref|| / ||ref||`` against the fp32 reference must be at most the bound
   of the dtype the kernel rounds to (:data:`TOLERANCE`, :func:`tolerance`);
4. the kernel must have left its **inputs intact** (fingerprinted before and after the launch): the families keep
   their inputs and references for every config a worker gates, so a config that writes into them would
   corrupt the gate of the next one (the family then draws new inputs).

The timers, used by every timing worker: :func:`time_flushed` (device events, the L2 flushed before each run
by :func:`flush_buffer`), :func:`back_to_back_ms` / :func:`events_ms` (what a user's loop sees, host cost
included), :func:`graph_replay_ms` (a captured graph: how a server runs decode).

A lower floor: this module imports only ``rocmflash.config`` and ``rocmflash.hw`` (never ``rocmflash.tuning``
or ``rocmflash.static``), and torch inside its functions.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Optional

#: the gate's bound on the relative L2 error, by the dtype a kernel rounds its operands and output to.
#: fp16 and bf16: a 16-bit kernel's error against fp32 attention is a few times the format's unit roundoff
#: (fp16 2**-11, bf16 2**-8) on random inputs, so 1e-2 / 2e-2 pass every correct config with margin and fail
#: a wrong tile, mask or scale. fp8: V's unit roundoff (e4m3: 2**-4; :func:`tolerance` gives a torch fp8 dtype
#: its own format's), as the fp8 forward rounds P to fp8 at the format's scale: its relative errors have rms
#: below ``u/sqrt(3)`` (2-2.5e-2 measured), so a correct config stays under ``u`` and a wrong one goes far past
#: it (:mod:`rocmflash.tuning.live_fp8`, ``tests/test_fp8_forward.py``).
TOLERANCE = {"fp16": 1e-2, "bf16": 2e-2, "fp8": 2.0 ** -4}

#: elements per piece of a fingerprint: its fp64 temporaries stay at 128 MiB however large the input
#: (a decode cache or a packed varlen batch is the whole timed tensor, not a stand-in)
_FINGERPRINT_CHUNK = 1 << 24


def tolerance(dtype) -> float:
    """The gate's bound for ``dtype``: a name of :data:`TOLERANCE` (``"fp16"``, ``"bf16"``, ``"fp8"``) or a torch
    dtype (an fp8 format: its unit roundoff, :func:`rocmflash.hw.fp8.unit_roundoff`; e5m2 is looser than e4m3).
    ValueError for any other."""
    if isinstance(dtype, str):
        if dtype not in TOLERANCE:
            raise ValueError(f"the gate has no bound for dtype {dtype!r}; expected one of {sorted(TOLERANCE)}")
        return TOLERANCE[dtype]
    import torch

    from rocmflash.hw.fp8 import is_fp8, unit_roundoff

    if is_fp8(dtype):
        return unit_roundoff(dtype)
    names = {torch.float16: "fp16", torch.bfloat16: "bf16"}
    if dtype not in names:
        raise ValueError(f"the gate has no bound for dtype {dtype}; expected fp16, bf16 or an fp8 format")
    return TOLERANCE[names[dtype]]


def poison(outputs: dict) -> None:
    """Fill every output buffer with NaN: whatever the launch leaves unwritten fails the finiteness check."""
    for t in outputs.values():
        t.fill_(float("nan"))


def relative_error(got, ref) -> float:
    """``||got - ref|| / ||ref||`` in fp32 (``ref`` an fp32 tensor of ``got``'s shape)."""
    return ((got.float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def fingerprint(tensors: dict) -> dict:
    """``{name: (sum, sum of squares)}`` of each tensor in fp64, piece by piece: it changes when a kernel writes
    into the tensor."""
    import torch

    prints = {}
    with torch.no_grad():
        for name, t in tensors.items():
            flat = t.detach().reshape(-1)
            parts = [torch.stack([c.double().sum(), c.double().square().sum()])
                     for c in flat.split(_FINGERPRINT_CHUNK)] or [torch.zeros(2, dtype=torch.float64)]
            prints[name] = tuple(torch.stack(parts).sum(0).tolist())  # one sync per tensor
    return prints


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What the gate found: ``passed``; ``rel_err``, the worst output's error (NaN when an output is not finite
    everywhere); ``errors`` ``{output: error}`` (NaN for a non-finite one); ``why`` one line when it failed, else
    ""; ``inputs_written``: the inputs the launch changed (the caller must drop its kept inputs)."""

    passed: bool
    rel_err: float
    errors: dict
    why: str = ""
    inputs_written: tuple = ()


def _parts(ref) -> list:
    """A reference as ``[(index, fp32 tensor), ...]``: one tensor compares with its whole output."""
    return ref if isinstance(ref, list) else [((), ref)]


def _errors(outputs: dict, reference: dict) -> dict:
    """``{output: worst relative error of its compared parts}``; NaN for an output not finite everywhere."""
    import torch

    errors = {}
    for name, t in outputs.items():
        if not bool(torch.isfinite(t).all()):
            errors[name] = float("nan")
        elif name in reference:
            errors[name] = max(relative_error(t[index], ref) for index, ref in _parts(reference[name]))
    return errors


def gate(launch: Callable[[], Optional[dict]], reference: dict, outputs: dict, inputs: dict, dtype,
         against: str = "the fp32 reference") -> Verdict:
    """Run ``launch()`` once and judge it (the rule in the module docstring).

    ``outputs``: ``{name: buffer}`` the launch writes, poisoned with NaN first. A launch that allocates its
    own outputs (the public API, an SDPA backend) returns them as ``{name: tensor}``; they join ``outputs``.
    ``reference``: ``{name: fp32 tensor}`` compared with the whole output ``name``, or ``{name: [(index,
    fp32 tensor), ...]}`` compared with ``outputs[name][index]`` (the first rows, a gated sequence), the
    worst part counting. Every output must be finite everywhere, compared or not.
    ``inputs``: ``{name: tensor}`` the launch reads and must leave as they were.
    ``dtype``: what :func:`tolerance` bounds the error by. ``against``: the reference, as the failure says it.
    Exceptions of the launch propagate (the caller reports a failed, not an incorrect, config).
    """
    before = fingerprint(inputs)
    poison(outputs)
    returned = launch()
    got = {**outputs, **returned} if isinstance(returned, dict) else dict(outputs)
    missing = sorted(set(reference) - set(got))
    if missing:
        raise ValueError(f"the gate has a reference for {missing} but no such output; outputs: {sorted(got)}")
    errors = _errors(got, reference)
    worst = float("nan") if any(math.isnan(e) for e in errors.values()) else max(errors.values(), default=0.0)
    after = fingerprint(inputs)
    written = tuple(name for name in inputs if after[name] != before[name])
    if written:
        why = f"the kernel wrote into its inputs {'/'.join(written)}"
        return Verdict(False, worst, errors, why, written)
    nonfinite = [name for name, e in errors.items() if math.isnan(e)]
    if nonfinite:
        return Verdict(False, worst, errors, _nonfinite_line(got, nonfinite))
    tol = tolerance(dtype)
    if not worst <= tol:
        return Verdict(False, worst, errors, f"relative error {worst:.3e} > {tol:g} against {against}")
    return Verdict(True, worst, errors)


def _nonfinite_line(outputs: dict, names: list) -> str:
    """``"3 of 64 elements of out are NaN/inf (unwritten or overflowed)"``, counting each non-finite output."""
    import torch

    counts = ", ".join(f"{int((~torch.isfinite(outputs[n])).sum())} of {outputs[n].numel()} elements of {n}"
                       for n in names)
    return f"{counts} are NaN/inf (unwritten or overflowed)"


# ---------------------------------------------------------------------- the cache flush
def device_flush_bytes(dev) -> int:
    """:func:`rocmflash.hw.gpus.flush_bytes` of a live device: its catalog GPU's caches (when
    :mod:`rocmflash.hw.detect` knows it) and the L2 its runtime reports."""
    import torch

    from rocmflash.hw.detect import identify_torch_device
    from rocmflash.hw.gpus import flush_bytes

    index = torch.cuda.current_device() if dev.index is None else dev.index
    l2 = int(getattr(torch.cuda.get_device_properties(index), "L2_cache_size", 0) or 0)
    hip = bool(getattr(torch.version, "hip", None))
    return flush_bytes(identify_torch_device(index).gpu, l2, amd=hip)


def flush_buffer(dev, nbytes: Optional[int] = None):
    """The buffer a timing worker zeroes before each timed run (every worker's flush comes from here), or
    None off a GPU (the interpreter's CPU tensors: nothing to flush). ``nbytes`` None: sized for the device
    (:func:`device_flush_bytes`)."""
    import torch

    if dev.type != "cuda":
        return None
    nbytes = device_flush_bytes(dev) if nbytes is None else int(nbytes)
    return torch.empty(nbytes // 4, device=dev, dtype=torch.int32)


# ---------------------------------------------------------------------- the timers
def time_flushed(fn: Callable[[], None], flush, reps: int) -> float:
    """Median ms of ``reps`` runs of ``fn``, the L2 flushed before each (device events; wall clock in the
    interpreter, where ``flush`` is None and the time measures the interpreter, never a GPU)."""
    import statistics
    import time

    import torch

    fn()
    if flush is None:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    torch.cuda.synchronize()
    for _ in range(3):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        flush.zero_()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def events_ms(fns: list, runs: int) -> float:
    """ms per run of ``runs`` back-to-back runs cycling through ``fns`` (device events)."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(runs):
        fns[i % len(fns)]()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / runs


def back_to_back_ms(fn: Callable[[], None], reps: int) -> float:
    """ms per call of ``reps`` back-to-back calls of ``fn`` between two device events (no flush): what a
    user's loop sees, host cost included wherever the host is slower than the GPU work it launches."""
    import torch

    fn()
    torch.cuda.synchronize()
    return events_ms([fn], reps)


def capture_graph(fns: list, calls: int, warmup: int = 1) -> Callable[[], None]:
    """``calls`` calls cycling through ``fns`` captured into one CUDA/HIP graph (after ``warmup`` calls of each
    on a side stream); returns the graph's ``replay``: no host work per replay but the replay itself."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            for fn in fns:
                fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fns[i % len(fns)]()
    return graph.replay


def graph_replay_ms(fns: list, calls: int, replays: int = 5, warmup: int = 1) -> float:
    """ms per call of a CUDA/HIP graph of ``calls`` calls cycling through ``fns`` (median over ``replays``).

    How a server runs decode: captured, back to back, no host work between kernels. ``fns``
    should touch different buffers (e.g. copies of a KV cache together larger than the L2), so
    that a call does not find the previous call's data in the cache: each layer of a model
    reads its own cache.
    """
    import statistics

    import torch

    replay = capture_graph(fns, calls, warmup)
    replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return statistics.median(times)


__all__ = ["TOLERANCE", "tolerance", "gate", "Verdict", "poison", "relative_error", "fingerprint",
           "device_flush_bytes", "flush_buffer", "time_flushed", "events_ms", "back_to_back_ms", "capture_graph",
           "graph_replay_ms"]
