"""The live runner's worker side: what runs inside a timing or pre-warm worker process (inputs, gate,
timing, pre-warm compiles), its settings and statuses, and the environment that pins a worker to a device.

The parent side -- :class:`rocmflash.tuning.live.LiveRunner`, which owns the pools -- imports this module,
never the reverse (so :mod:`rocmflash.tuning.isolated` can use the worker side without an import circle).
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import Optional

from rocmflash.config import FP8, KernelConfig, Problem
from rocmflash.hw.roofline import Shape, tflops
from rocmflash.messages import error_line
from rocmflash.measure import events_ms  # the timers live in measure (re-exported: users import it from here)
from rocmflash.tuning.live_gate import gate as _gate
from rocmflash.tuning.live_gate import interpreting as _interpreting
from rocmflash.tuning.live_gate import torch_dtype as _torch_dtype

#: worker results with these statuses are final for a config (journaled, never retried)
STATUSES = ("ok", "incorrect", "failed", "timeout", "crashed")
#: test mode: ``task["inject"]`` makes the worker fail on purpose
INJECT_MODES = ("crash", "hang", "illegal")
#: interpreter mode: timed launches per config (the times are the interpreter's, not a GPU's)
INTERPRET_REPS = 3
#: interpreter mode: the longest sequence length timed
INTERPRET_MAX_SEQLEN = 64


@dataclasses.dataclass(frozen=True)
class LiveSettings:
    """How candidates are timed and isolated."""

    timeout_s: float = 120.0  #: per candidate (gate + warm-up + timing, and a JIT compile if not pre-warmed)
    warmup_ms: float = 25.0
    rep_ms: float = 100.0
    min_reps: int = 10
    max_reps: int = 200
    n_inputs: int = 3  #: rotating input sets
    flush_bytes: Optional[int] = None  #: cache flush; None: sized from the GPU (:func:`rocmflash.hw.gpus.flush_bytes`)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# ====================================================================== worker side
_STATE: dict = {}


def worker_init(triton_cache_dir: Optional[str], env: Optional[dict] = None, interpret: bool = False) -> None:
    """Runs once per worker, before any task's timeout starts: pin the device, import torch, create the context.

    ``env`` holds the device-visibility variables from the parent; ``interpret`` says
    whether the parent runs kernels in Triton's interpreter (then so does the worker).
    """
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C belongs to the parent, which stops the pool
    # Before torch touches the device: HIP/CUDA read the visibility variables once, when the
    # runtime initialises, which torch defers to its first device call (below).
    os.environ.update(env or {})
    if triton_cache_dir:
        os.environ["TRITON_CACHE_DIR"] = triton_cache_dir
    if interpret:
        os.environ["TRITON_INTERPRET"] = "1"
    else:  # a worker times compiled kernels, whatever the environment it inherited
        os.environ.pop("TRITON_INTERPRET", None)
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if torch.cuda.is_available() and not interpret:
        torch.cuda.init()


def kernel_module(cfg: KernelConfig, shape: Shape):
    """What a worker launches for ``cfg`` on ``shape``: the variant's module, or for an fp8 shape the fp8 forward
    (:class:`rocmflash.tuning.live_fp8.Fp8Forward`, the worker's arch; online only)."""
    if shape.dtype == FP8:
        from rocmflash.tuning import live_fp8

        if cfg.variant != "online":
            raise ValueError(f"fp8 attention runs the online kernel only; got variant={cfg.variant!r}")
        return live_fp8.kernel()
    from rocmflash.kernels import get_variant

    return get_variant(cfg.variant)


def launch_set(mod, cfg: KernelConfig, causal: bool, scale: float, s: tuple):
    """Launch ``mod`` on one input set ``(q, k, v, out, descales or None)`` (:func:`_inputs`)."""
    q, k, v, out, descales = s
    if descales is None:
        return mod.launch(q, k, v, cfg, causal, scale, out=out)
    return mod.launch(q, k, v, cfg, causal, scale, out=out, descales=descales)


def input_set(shape: Shape, dev, arch=None) -> tuple:
    """One random input set ``(q, k, v, out, descales)`` of ``shape`` (descales None but for fp8:
    :func:`rocmflash.tuning.live_fp8.inputs`, in ``arch``'s format)."""
    import torch

    if shape.dtype == FP8:
        from rocmflash.tuning import live_fp8

        return live_fp8.inputs(shape, dev, arch=arch)
    dtype = _torch_dtype(torch, shape.dtype)
    q = torch.randn(shape.batch, shape.heads_q, shape.seqlen_q, shape.head_dim, device=dev, dtype=dtype)
    k = torch.randn(shape.batch, shape.heads_kv, shape.seqlen_k, shape.head_dim, device=dev, dtype=dtype)
    return q, k, torch.randn_like(k), torch.empty_like(q), None


def _inputs(shape: Shape, settings: LiveSettings, dev=None, arch=None):
    """Rotating input sets (:func:`input_set`) and the cache flush buffer for a shape (kept across configs in
    this worker)."""
    import torch

    from rocmflash.measure import flush_buffer

    dev = torch.device("cuda") if dev is None else dev
    key = (shape, settings.n_inputs, settings.flush_bytes, dev, arch)
    if _STATE.get("key") != key:
        _STATE.clear()
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        sets = [input_set(shape, dev, arch) for _ in range(settings.n_inputs)]
        flush = flush_buffer(dev, settings.flush_bytes)
        _STATE.update(key=key, sets=sets, flush=flush)
    return _STATE["sets"], _STATE["flush"]


def _time(mod, cfg: KernelConfig, shape: Shape, settings: LiveSettings) -> list[float]:
    import torch

    sets, flush = _inputs(shape, settings, arch=getattr(mod, "arch", None))
    scale = 1.0 / math.sqrt(shape.head_dim)
    fns = [(lambda s=s: launch_set(mod, cfg, shape.causal, scale, s)) for s in sets]
    n_sets = len(fns)
    fns[0]()  # the first launch of a config loads its binary
    torch.cuda.synchronize()
    # estimate one run: a single run when it is long enough to time alone (a 15 ms kernel need not run
    # five times to be estimated: that was most of a 10 ms race screen), else five back to back
    est, est_runs = events_ms(fns, 1), 1
    if est < ESTIMATE_ALONE_MS:
        est, est_runs = events_ms(fns, 5), 6
    est = max(est, 1e-3)
    # the estimate's runs count toward the warm-up
    for i in range(max(0, min(100, int(settings.warmup_ms / est) - est_runs))):
        fns[i % n_sets]()
    n = max(settings.min_reps, min(settings.max_reps, int(settings.rep_ms / est)))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for i in range(n):
        flush.zero_()
        starts[i].record()
        fns[i % n_sets]()
        ends[i].record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


#: a run at least this long (ms) is its own estimate in :func:`_time`
ESTIMATE_ALONE_MS = 1.0


def interpreted_shape(shape: Shape) -> Shape:
    """The shape timed under the interpreter: batch 1, one KV head and its query group, short sequences."""
    return dataclasses.replace(shape, batch=1, heads_q=shape.heads_q // shape.heads_kv, heads_kv=1,
                               seqlen_q=min(shape.seqlen_q, INTERPRET_MAX_SEQLEN),
                               seqlen_k=min(shape.seqlen_k, INTERPRET_MAX_SEQLEN))


def _time_interpreted(mod, cfg: KernelConfig, shape: Shape) -> tuple[list[float], Shape]:
    """``(times in ms, the shape timed)``: wall-clock times of interpreted launches on the CPU."""
    import torch

    tiny = interpreted_shape(shape)
    s = input_set(tiny, torch.device("cpu"), getattr(mod, "arch", None))
    scale = 1.0 / math.sqrt(tiny.head_dim)
    times = []
    for _ in range(INTERPRET_REPS):
        start = time.perf_counter()
        launch_set(mod, cfg, tiny.causal, scale, s)
        times.append((time.perf_counter() - start) * 1e3)
    return times, tiny


def _median(times: list[float]) -> float:
    ordered = sorted(times)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


def _device_env() -> dict:
    """The worker's device-visibility variables (reported with every result)."""
    from rocmflash.hw.platform import VISIBILITY_VARS

    return {var: os.environ[var] for var in VISIBILITY_VARS if var in os.environ}


def _device_broken() -> bool:
    import torch

    if _interpreting():  # no device context that a bad kernel could have broken
        return False
    try:
        torch.cuda.synchronize()
        torch.zeros(1, device="cuda").add_(1).item()
        return False
    except Exception:
        return True


def _inject(mode: str, shape: Shape) -> None:
    if mode == "crash":  # a segfault, as a driver or compiler crash would give
        import ctypes

        ctypes.string_at(0)
    if mode == "hang":
        while True:
            time.sleep(1)
    if mode == "illegal":  # a kernel storing 4 TiB past its buffer: an illegal memory access
        import torch

        x = torch.zeros(16, device="cuda", dtype=torch.float32)
        _oob_kernel()[(1,)](x, 1 << 40)
        torch.cuda.synchronize()


def _oob_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def oob_store(ptr, offset):
        tl.store(ptr + offset + tl.arange(0, 16), tl.full((16,), 1.0, tl.float32))

    return oob_store


def measure(task: dict) -> dict:
    """Worker entry: gate, then time, one config on one shape. Never raises for a bad config."""
    start = time.perf_counter()
    cfg = KernelConfig.from_dict(task["config"])
    shape = Shape.from_dict(task["shape"])
    settings = LiveSettings(**task["settings"])
    result = {"status": None, "median_ms": None, "times_ms": None, "tflops": None, "rel_err": None, "error": None,
              "device_env": _device_env()}
    if _interpreting():
        result["interpreted"] = True
    try:
        if task.get("inject"):
            _inject(task["inject"], shape)
        mod = kernel_module(cfg, shape)
        t0 = time.perf_counter()
        if task.get("gate", True):
            ok, err, why = _gate(mod, cfg, shape)
        else:  # a race's screening round: the config is gated before it can win
            ok, err, why = True, float("nan"), ""
        result["gate_s"] = round(time.perf_counter() - t0, 3)
        result["rel_err"] = None if math.isnan(err) else err
        if not ok:
            result.update(status="incorrect", error=why)
        else:
            if _interpreting():
                times, timed = _time_interpreted(mod, cfg, shape)
                result["timed_shape"] = timed.to_dict()
            else:
                times, timed = _time(mod, cfg, shape, settings), shape
            med = _median(times)
            result.update(status="ok", median_ms=med, times_ms=[round(t, 5) for t in times],
                          tflops=tflops(timed, med))
    except Exception as err:  # compile error, out of resources, launch failure, device fault
        result["error"] = error_line(err)
        if _device_broken():
            result.update(status="crashed", fatal=True,
                          error=result["error"] + " (device context unusable: worker replaced)")
        else:
            result["status"] = "failed"
    result["worker_s"] = round(time.perf_counter() - start, 3)
    return result


def _ready() -> bool:
    """A no-op task: scheduling it starts a worker (its initializer) ahead of the first measurement."""
    return True


# ---------------------------------------------------------------------- pre-warm worker
#: how much lower than the tune's own processes a kept pre-warm worker runs (``os.nice``): the pool's processes
#: start with the tune and import torch all at once while the scheduler and the timing workers start too; below
#: them, above the compile workers (:data:`rocmflash.static.compile.COMPILE_NICENESS`), whose output they launch
PREWARM_NICENESS = 5


def prewarm_init(triton_cache_dir: Optional[str], env: Optional[dict] = None) -> None:
    """:func:`worker_init` of a pre-warm worker, never interpreted: when the runner interprets, a
    pre-warm worker only cross-compiles, and ``triton.jit`` decides at import time between
    compiled and interpreted functions (Triton's own helpers included), so Triton must be
    imported without ``TRITON_INTERPRET`` here. Runs at :data:`PREWARM_NICENESS`."""
    from rocmflash.hw.platform import lower_priority

    lower_priority(PREWARM_NICENESS)
    worker_init(triton_cache_dir, env, interpret=False)


def _prewarm_seqlen(n: int) -> int:
    """A short sequence length with the same Triton specialisation as ``n`` (``== 1``, ``% 16 == 0``)."""
    return n if (n % 16 or n <= 256) else 256


def prewarm_one(task: dict) -> Optional[str]:
    """Build one config at a tiny shape with the tuned shape's specialisation (fills Triton's cache).

    On a GPU: one launch. With ``task["cross_compile"]`` (the runner interprets): a
    cross-compile for Triton's active target (nothing to do when there is none).
    Returns None, or the error's first line.
    """
    cfg = KernelConfig.from_dict(task["config"])
    s = Shape.from_dict(task["shape"])
    try:
        if task.get("cross_compile"):
            _cross_compile(kernel_module(cfg, s), cfg, s)
        else:
            _launch_once(kernel_module(cfg, s), cfg, s)
        return None
    except Exception as err:
        return error_line(err, 200)


def prewarm_plan(mod, cfg: KernelConfig, s: Shape, compute_units: int) -> tuple[KernelConfig, int, int]:
    """``(config, seqlen_q, seqlen_k)`` of a tiny launch that builds the binaries a launch of ``s`` runs.

    Short sequences keep Triton's specialisation of the lengths (:func:`_prewarm_seqlen`).
    ``split_kv`` also passes its split count as a kernel argument (specialised: ``== 1``
    is a constant, ``% 16 == 0`` an alignment hint), and picks it from the shape: the
    tiny launch pins the count the real shape gets, with enough keys to allow it. (Without
    this, every split_kv config was compiled a second time by the timing worker: ~1.7 s
    each on an H100 host, most of a race's screening round.)
    """
    seqlen_q, seqlen_k = _prewarm_seqlen(s.seqlen_q), _prewarm_seqlen(s.seqlen_k)
    if cfg.variant == "split_kv":
        splits = mod.choose_splits(cfg, s.batch * s.heads_q, s.seqlen_q, s.seqlen_k, compute_units)
        cfg = cfg.replace(num_splits=splits)
        if seqlen_k != s.seqlen_k:  # shortened (a multiple of 16): room for one key block per split
            seqlen_k = max(seqlen_k, splits * cfg.BLOCK_N)
    return cfg, seqlen_q, seqlen_k


def prewarm_specs(s: Shape, seqlen_q: int, seqlen_k: int) -> dict:
    """The pre-warm launch's tensors ``{"q", "k", "out": (dims, bytes of the timed tensor)}`` (``k`` serves
    as ``v`` too): batch 1 at the planned lengths, each standing for the timed tensor of ``s``, whose side
    of the 2 GiB line it must keep (:func:`rocmflash.tuning.live_gate.stand_ins`)."""
    from rocmflash.tuning.live_gate import out_bytes, tensor_bytes

    q_real, kv_real = tensor_bytes(s)
    q_dims = (1, s.heads_q, seqlen_q, s.head_dim)
    return {"q": (q_dims, q_real), "k": ((1, s.heads_kv, seqlen_k, s.head_dim), kv_real), "out": (q_dims, out_bytes(s))}


def _launch_once(mod, cfg: KernelConfig, s: Shape) -> None:
    import torch

    from rocmflash.kernels.common import num_compute_units
    from rocmflash.tuning.live_gate import pads_storage, stand_ins

    dev = torch.device("cuda")
    cfg, seqlen_q, seqlen_k = prewarm_plan(mod, cfg, s, num_compute_units(dev))
    specs = prewarm_specs(s, seqlen_q, seqlen_k)
    if s.dtype != FP8:
        t = stand_ins(specs, _torch_dtype(torch, s.dtype), dev, pads_storage())
        mod.launch(t["q"], t["k"], t["k"], cfg, s.causal, 0.125, out=t["out"])
    else:  # fp8 inputs, a bf16 output, V row-major as the timed launches get it (so V's K-major copy builds too)
        from rocmflash.tuning import live_fp8

        t = stand_ins({"q": specs["q"], "k": specs["k"]}, mod.dtype, dev, pads_storage())
        out = stand_ins({"out": specs["out"]}, torch.bfloat16, dev, pads_storage())["out"]
        descales = live_fp8.descales(1, s.heads_kv, mod.dtype, dev)
        mod.launch(t["q"], t["k"], t["k"], cfg, s.causal, 0.125, out, descales)
    torch.cuda.synchronize()


def active_target():
    """Triton's current target (``GPUTarget``), or None when no GPU driver is active (plain CPU)."""
    from triton.runtime import driver

    try:
        return driver.active.get_current_target()
    except RuntimeError:  # Triton found no active backend
        return None


def prewarm_problem(s: Shape) -> Problem:
    """The compile-only problem of a pre-warm cross-compile for ``s``: batch 1 at short lengths of the same
    specialisation, unless a tensor of ``s`` is past the 2 GiB line (then ``s``'s own sizes, as
    :func:`rocmflash.tuning.spec.static_problem` keeps them: a compile-only build allocates nothing)."""
    from rocmflash.tuning.live_gate import beyond_32bit_range, largest_bytes

    if beyond_32bit_range(largest_bytes(s)):
        batch, seqlen_q, seqlen_k = s.batch, s.seqlen_q, s.seqlen_k
    else:
        batch, seqlen_q, seqlen_k = 1, _prewarm_seqlen(s.seqlen_q), _prewarm_seqlen(s.seqlen_k)
    return Problem(head_dim=s.head_dim, dtype=s.dtype, causal=s.causal, batch=batch, heads_q=s.heads_q,
                   heads_kv=s.heads_kv, seqlen_q=seqlen_q, seqlen_k=seqlen_k)


def _cross_compile(mod, cfg: KernelConfig, s: Shape) -> None:
    """Compile what a launch of ``s`` would compile, for the active target, without a device."""
    target = active_target()
    if target is None:
        return
    mod.compile_for(target, cfg, prewarm_problem(s))


def worker_env(device_index: int, environ=None, rocm: Optional[bool] = None) -> dict:
    """The environment changes that pin a worker of this process to ``device_index`` (``rocm``: whether torch is a
    ROCm build; None: ask torch, which imports it)."""
    from rocmflash.hw.platform import is_rocm, visible_devices_env

    return visible_devices_env(device_index, os.environ if environ is None else environ,
                               is_rocm() if rocm is None else rocm)
