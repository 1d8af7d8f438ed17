"""The first-use decision: a problem no measured entry covers is timed once, rocmflash's kernel against SDPA.

Importing rocmflash must never make a model slower, and most problems a model runs were never tuned. So where no
measured database entry decides a dense call (:func:`rocmflash.api.host_bound.timed_sides`: no entry within the
incumbent rule's bucket distance, or one without a timed incumbent, forward or forward+backward; a decode-shaped
call: no ``decode-`` entry's timing, forward only, :func:`rocmflash.api.ops.decode_timed`), the first eager
call of the problem on a live GPU times both sides -- rocmflash's served call and the platform's SDPA (its own
backend choice, ``default``) -- on the call's own tensors, and the faster one serves this call and every later one,
as ``torch.backends.cudnn.benchmark`` does for convolutions. The decision is made per side (forward alone;
forward+backward, for a call that needs gradients) and per problem bucket (:func:`decision_key`: head dim, dtype,
mask, GQA ratio and the powers of two of the query length, the key length and batch x query heads).

Cost, bounded: one warm-up call of each side (rocmflash's first launch compiles its kernel, as it would anyway),
one probe call each, then :data:`ROUNDS` interleaved rounds of ``n`` back-to-back calls between two events (``n``
fills :data:`TARGET_MS`, at most :data:`MAX_REPEAT`): at most ``2 + 3 * 10 = 32`` calls of each side for a tiny
problem, ``2 + 3 = 5`` for one that takes 1 ms or more. Training inputs are detached leaves of the call's tensors
(no copy, the caller's graph untouched) with a random output gradient. rocmflash serves only when it is faster by
more than :data:`MARGIN`; a tie goes to SDPA.

Timing that runs out of GPU memory (its training buffers come on top of the model's) serves SDPA for the
process, records nothing and warns once. Kept: in memory for the process, and in
``<user config dir>/<gpu>.first-use.json`` (beside the user's tuned database, written atomically under a lock; a record from another rocmflash, Triton, torch, GPU runtime or device is
timed again). Never timed while a CUDA graph captures (SDPA serves that call, nothing is recorded), nor under
``torch.compile`` (the op keeps the graph whole: rocmflash's kernel), nor under ``ROCMFLASH_NO_INCUMBENT``, a
config override (the tuner's) or deterministic gradients. ``ROCMFLASH_FIRST_USE_TIMING=0`` turns it off: an
untimed problem then runs rocmflash's kernel. A file that cannot be read or written keeps the decisions in memory
(one warning); a malformed one is never overwritten.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import warnings
from typing import Callable, Optional

from rocmflash.messages import error_line

#: ``ROCMFLASH_FIRST_USE_TIMING=0``: never time a problem at its first use (an untimed one runs rocmflash's kernel)
ENV = "ROCMFLASH_FIRST_USE_TIMING"
ROUNDS = 3  #: interleaved rounds per side
TARGET_MS = 1.0  #: a round's back-to-back calls fill about this much (host time shows on short calls)
MAX_REPEAT = 10  #: calls per round at most
MARGIN = 0.02  #: rocmflash serves only if faster than SDPA by more than this fraction (a tie goes to SDPA)
FORMAT = "rocmflash-first-use"
SCHEMA_VERSION = 1
TIMING = ("first use, eager per call, host time included: median of 3 interleaved rounds of back-to-back calls "
          "between two events, after a warm-up")
#: the environment fields a record must share with this process to be used
ENV_FIELDS = ("rocmflash", "triton", "torch", "runtime", "device")


def enabled() -> bool:
    """Whether first-use timing is on (``ROCMFLASH_FIRST_USE_TIMING`` unset or not ``0``), read when a plan is made."""
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "off", "no")


def on_live_gpu(q) -> bool:
    """Whether ``q`` is on a GPU that runs the compiled kernels (CUDA or ROCm; not the interpreter)."""
    from rocmflash.kernels.launch import interpreting

    return bool(q.is_cuda) and not interpreting()


def capturing(q) -> bool:
    """Whether ``q``'s GPU stream is capturing a CUDA graph (no timing then)."""
    from rocmflash.kernels.error_words import capturing as stream_capturing

    return stream_capturing(q.device)


def decision_key(head_dim: int, dtype, causal: bool, group: int, batch: int, heads_q: int, seqlen_q: int,
                 seqlen_k: int, train: bool) -> str:
    """The problem bucket a decision holds for: ``d128-bf16-causal-gqa4-q8192-k8192-bh64-train``."""
    from rocmflash.db import key_dtype, seqlen_bucket as bucket

    return (f"d{int(head_dim)}-{key_dtype(dtype)}-{'causal' if causal else 'full'}-gqa{int(group)}"
            f"-q{bucket(seqlen_q)}-k{bucket(seqlen_k)}-bh{bucket(batch * heads_q)}-{'train' if train else 'fwd'}")


def winner(rocmflash_ms: float, sdpa_ms: float) -> str:
    """``"rocmflash"`` where it is faster than SDPA by more than :data:`MARGIN`, else ``"sdpa"``."""
    return "rocmflash" if rocmflash_ms < sdpa_ms * (1.0 - MARGIN) else "sdpa"


# ----------------------------------------------------------------------------- timing
def event_timer(step: Callable[[], object], n: int) -> float:
    """ms per call of ``n`` back-to-back ``step()`` calls between two events on the current stream."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        step()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / n


def measure(sides: dict, timer: Optional[Callable] = None) -> dict:
    """``{side name: ms per call}`` of each ``step`` in ``sides``: a warm-up, a probe, then :data:`ROUNDS`
    interleaved rounds of ``n`` calls (``n`` fills :data:`TARGET_MS`, at most :data:`MAX_REPEAT`); the median.
    ``timer(step, n)``: ms per call (default :func:`event_timer`, looked up per call)."""
    timer = timer or event_timer
    for step in sides.values():
        step()
    repeat = {}
    for name, step in sides.items():
        probe = timer(step, 1)
        repeat[name] = max(1, min(MAX_REPEAT, math.ceil(TARGET_MS / max(probe, 1e-3))))
    times: dict = {name: [] for name in sides}
    order = list(sides)
    for r in range(ROUNDS):
        for name in (order if r % 2 == 0 else order[::-1]):
            times[name].append(timer(sides[name], repeat[name]))
    return {name: statistics.median(ts) for name, ts in times.items()}


def side_steps(rocmflash_call, sdpa_call, q, k, v, scale, train: bool) -> dict:
    """``{"rocmflash": step, "sdpa": step}``: one call of each side on the call's tensors (``train``: forward and
    backward on detached leaves of them, a fixed random output gradient; the caller's graph is untouched)."""
    import torch

    if not train:
        def forward(run):
            def step():
                with torch.no_grad():
                    run(q, k, v, scale)
            return step
        return {"rocmflash": forward(lambda *a: rocmflash_call(*a, False)), "sdpa": forward(sdpa_call)}
    leaves = tuple(t.detach().requires_grad_(True) for t in (q, k, v))
    grad_out = torch.randn(q.shape, dtype=q.dtype, device=q.device)

    def training(run):
        def step():
            with torch.enable_grad():
                out = run(*leaves, scale)
                torch.autograd.grad(out, leaves, grad_out)
        return step
    return {"rocmflash": training(lambda *a: rocmflash_call(*a, True)), "sdpa": training(sdpa_call)}


# ----------------------------------------------------------------------------- the decisions kept
_MEMORY: dict = {}  #: (gpu or device, key) -> record
_FILES: dict = {}  #: gpu -> the decisions file's records as read (or None: unreadable)
_WARNED: set = set()
_ENV: list = []


def environment(device) -> dict:
    """What a record must share with this process (:data:`ENV_FIELDS`), the device's name included."""
    if not _ENV:
        from rocmflash.db import environment as db_environment

        _ENV.append(db_environment(None))
    import torch

    env = {k: _ENV[0].get(k) for k in ENV_FIELDS}
    env["device"] = torch.cuda.get_device_name(device) if getattr(device, "type", "") == "cuda" else str(device)
    return env


def decisions_path(gpu: str) -> str:
    """Where the decisions of ``gpu`` are kept: beside the user's tuned database."""
    from rocmflash.db import user_config_dir

    return os.path.join(user_config_dir(), f"{gpu}.first-use.json")


def _warn_once(what: str, line: str) -> None:
    if what not in _WARNED:
        _WARNED.add(what)
        warnings.warn(f"rocmflash: {line}", RuntimeWarning, stacklevel=3)


def _read_file(gpu: str) -> Optional[dict]:
    """The decisions file's records (``{}`` when there is none), or None where it cannot be used."""
    try:
        path = decisions_path(gpu)
        if not os.path.exists(path):
            return {}
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("decisions"), dict):
            raise ValueError(f"not a {FORMAT} file of schema {SCHEMA_VERSION}")
        return data["decisions"]
    except Exception as err:  # a broken file must not break attention: decisions stay in memory
        _warn_once(("read", gpu), f"first-use decisions file of {gpu} is not used ({error_line(err)}); "
                                  "decisions stay in memory and the file is left as it is")
        return None


def recorded(gpu: Optional[str], key: str, env: dict) -> Optional[dict]:
    """The record of ``key`` made in this environment (memory, then ``gpu``'s file), or None."""
    rec = _MEMORY.get((gpu, key))
    if rec is None and gpu is not None:
        if gpu not in _FILES:
            _FILES[gpu] = _read_file(gpu)
        rec = (_FILES[gpu] or {}).get(key)
    if not isinstance(rec, dict) or rec.get("environment") != env or rec.get("served_by") not in ("rocmflash", "sdpa"):
        return None
    _MEMORY[(gpu, key)] = rec
    return rec


def stored(gpu: str, key: str) -> Optional[dict]:
    """The record of ``key`` in ``gpu``'s decisions file whatever environment made it (``rocmflash explain``), or
    None."""
    rec = (_read_file(gpu) or {}).get(key)
    return rec if isinstance(rec, dict) else None


def record(gpu: Optional[str], key: str, rec: dict) -> None:
    """Keep ``rec`` in memory and, for a catalog GPU, in its decisions file (read, merged, written atomically under
    a lock; a file that is malformed or cannot be written is left alone, with one warning)."""
    _MEMORY[(gpu, key)] = rec
    if gpu is None or _FILES.get(gpu, {}) is None:
        return
    try:
        import filelock

        from rocmflash.db import atomic_write_json

        path = decisions_path(gpu)
        with filelock.FileLock(path + ".lock", timeout=5):
            current = _read_file(gpu)
            if current is None:
                _FILES[gpu] = None
                return
            current[key] = rec
            atomic_write_json(path, {"format": FORMAT, "schema_version": SCHEMA_VERSION, "gpu": gpu,
                                     "decisions": dict(sorted(current.items()))})
            _FILES[gpu] = current
    except Exception as err:
        _warn_once(("write", gpu), f"first-use decisions of {gpu} are kept in memory only: {error_line(err)}")


def out_of_memory(key: str) -> None:
    """Say once that timing ``key`` ran out of GPU memory (SDPA serves it in this process, nothing is recorded)."""
    _warn_once(("oom", key), f"first-use timing of {key} ran out of GPU memory; the platform's SDPA serves it in "
                             "this process and nothing is recorded (rocmflash tune times it apart from a model)")


def forget() -> None:
    """Forget the decisions kept in memory (the files stay; they are read again)."""
    _MEMORY.clear()
    _FILES.clear()


# ----------------------------------------------------------------------------- the deciding call
def decide(gpu: Optional[str], key: str, env: dict, steps: dict, shape: dict, timer: Optional[Callable] = None) -> dict:
    """Time ``steps`` (:func:`side_steps`) and keep the record: the side that serves, both times, what was timed.
    Where SDPA refuses the problem (``RuntimeError``/``NotImplementedError``), rocmflash serves it."""
    try:
        times = measure(steps, timer)
        served = winner(times["rocmflash"], times["sdpa"])
        why = None
    except (RuntimeError, NotImplementedError) as err:
        import torch

        if isinstance(err, torch.OutOfMemoryError) or not _sdpa_refused(steps):
            raise
        times, served = {}, "rocmflash"
        why = f"SDPA refused: {error_line(err, 200)}"
    from rocmflash.db import now_iso

    rec = {"served_by": served, "measured": "online", "rocmflash_ms": _round(times.get("rocmflash")),
           "sdpa_ms": _round(times.get("sdpa")), "sdpa_backend": "default", "timing": TIMING, "shape": shape,
           "when": now_iso(), "environment": env}
    if why:
        rec["why"] = why
    record(gpu, key, rec)
    return rec


def _sdpa_refused(steps: dict) -> bool:
    """Whether SDPA's step raises (the measure failed on its side, not on rocmflash's)."""
    try:
        steps["sdpa"]()
    except (RuntimeError, NotImplementedError):
        return True
    return False


def _round(x: Optional[float]) -> Optional[float]:
    return None if x is None else round(float(x), 5)


__all__ = ["ENV", "enabled", "decision_key", "winner", "measure", "side_steps", "recorded", "stored", "record",
           "decide", "decisions_path", "forget", "out_of_memory", "event_timer", "environment"]
