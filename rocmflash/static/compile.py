"""Static sweep: cross-compile configs in parallel on the CPU and observe each code object.

Pure and cached: a config's observation (what the compiler allocated, spilled and
what occupancy follows) depends only on the kernel source, Triton's version, the
target, the compile options and the problem constants. Those form the cache key;
a warm re-run reads every observation from disk and compiles nothing.

Workers are spawned processes that never touch a GPU (device visibility is cleared
before anything imports torch), each compile has a timeout after which its worker is
killed and replaced, and a compile error is a recorded observation, not a crash.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import multiprocessing
import os
import tempfile
import time
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Callable, Optional

from rocmflash.config import FP8, KernelConfig, Problem
from rocmflash.hw.compat import require_supported_versions
from rocmflash.hw.gpus import GPU

require_supported_versions()  # the sweep cross-compiles: fail in one line before any worker starts

#: 2: each kernel's observation says where it uses scratch (``scratch_*`` keys, :mod:`isa_tools.scratch`);
#: a v1 entry lacks them and lives under static-v1/, so it is recompiled rather than misread.
#: 3: pointers compiled as a launch marks them (on AMD: buffer loads for tensors under 2 GiB,
#: :func:`rocmflash.kernels.build.launch_attributes`); v2 builds used global loads
CACHE_SCHEMA = 3
CACHE_ENV = "ROCMFLASH_CACHE_DIR"
DEFAULT_TIMEOUT_S = 180.0
_SOURCE_HASH: Optional[str] = None


def default_cache_dir() -> str:
    """``$ROCMFLASH_CACHE_DIR``, else the user cache directory (``~/.cache/rocmflash`` on Linux)."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return env
    import platformdirs

    return platformdirs.user_cache_dir("rocmflash")


#: the files that decide what a forward variant compiles to (the backward kernels are not swept,
#: so editing them must not invalidate every cached observation)
FORWARD_SOURCES = ("config.py", "kernels/__init__.py", "kernels/common.py", "kernels/build.py", "kernels/launch.py",
                   "kernels/forward/__init__.py",
                   "kernels/forward/online.py", "kernels/forward/split_kv.py", "kernels/forward/two_phase.py",
                   "kernels/forward/split_d.py", "kernels/fp8/forward.py", "hw/fp8.py")  # hw/fp8.py: formats, P's scale


def kernel_source_hash() -> str:
    """Hash of every file that decides what the forward kernels compile to."""
    global _SOURCE_HASH
    if _SOURCE_HASH is None:
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the rocmflash package
        digest = hashlib.sha256()
        for name in FORWARD_SOURCES:
            digest.update(name.encode())
            with open(os.path.join(here, name), "rb") as f:
                digest.update(f.read())
        _SOURCE_HASH = digest.hexdigest()
    return _SOURCE_HASH


#: the environment variables Triton's compiler reads (3.4-3.9: AMD ``make_ttgir``/``make_llir``, option
#: parsing) that change what a kernel compiles to, per backend, so an observation under one setting must not
#: answer for another. Triton's own cache keys on some of them only (not e.g. ``AMDGCN_ANALYZE_SMALL_TENSOR_RANGE``).
_ANY_BACKEND_ENV_VARS = (
    # the arch actually compiled for, FMA fusion, LLVM's optimiser, sanitizer instrumentation, debug info
    "TRITON_OVERRIDE_ARCH", "TRITON_DEFAULT_FP_FUSION", "TRITON_FORCE_DISABLE_FP_FUSION", "DISABLE_LLVM_OPT",
    "TRITON_ENABLE_ASAN", "TRITON_DISABLE_LINE_INFO", "LLVM_EXTRACT_DI_LOCAL_VARIABLES",
)
BUILD_ENV_VARS = {
    "hip": (
        # buffer loads/stores/atomics instead of global ones (3.6+: on by default; 3.4/3.5: off by default)
        "AMDGCN_USE_BUFFER_OPS", "AMDGCN_USE_BUFFER_ATOMICS", "AMDGCN_ANALYZE_SMALL_TENSOR_RANGE",
        "AMDGCN_SCALARIZE_PACKED_FOPS",
        # AMD pipeliner and scheduling passes
        "TRITON_HIP_USE_ASYNC_COPY", "TRITON_HIP_USE_BLOCK_PINGPONG", "TRITON_HIP_USE_IN_THREAD_TRANSPOSE",
        "TRITON_HIP_GLOBAL_PREFETCH", "TRITON_HIP_LOCAL_PREFETCH",  # 3.4/3.5
        "TRITON_HIP_USE_COEXEC_SCHEDULER", "TRITON_HIP_USE_EXPERT_SCHEDULING",  # 3.8+
        "TRITON_SWAP_MIR", "TRITON_SWAP_MIR_ENABLE_MISCHED",  # 3.8+: replaces the machine IR
        "TRITON_AMD_CODEGEN_PATH",  # 3.9+: another code generator library than the wheel's
    ) + _ANY_BACKEND_ENV_VARS,
    "cuda": _ANY_BACKEND_ENV_VARS,
}


def build_env(backend: str) -> dict:
    """The ``BUILD_ENV_VARS[backend]`` set in this process, with their values (the workers inherit them)."""
    return {var: os.environ[var] for var in BUILD_ENV_VARS.get(backend, ()) if var in os.environ}


def _target_key(gpu: GPU) -> list:
    """The target part of a cache key: backend, arch, wave size, the attributes a launch gives a tensor
    (under and over 2 GiB) and an integer (divisible by 16 or not) -- as this Triton's backend answers
    (on AMD they depend on Triton's version and ``AMDGCN_USE_BUFFER_OPS``) -- and :func:`build_env`."""
    from rocmflash.kernels.build import MAX_32BIT_RANGE, Ptr, launch_attributes

    target = gpu.triton_target()
    pointer_attrs, int_attrs = launch_attributes(target)
    attrs = [pointer_attrs(Ptr("*fp16")), pointer_attrs(Ptr("*fp16", MAX_32BIT_RANGE + 1)),
             int_attrs(True), int_attrs(False)]
    return [target.backend, str(target.arch), target.warp_size, attrs, build_env(target.backend)]


def fingerprint(cfg: KernelConfig, problem: Problem, gpu: GPU) -> str:
    """Cache key of one compile: kernel source, Triton version, target, options and problem."""
    import triton

    key = {
        "schema": CACHE_SCHEMA,
        "source": kernel_source_hash(),
        "triton": triton.__version__,
        "target": _target_key(gpu),
        "options": cfg.compile_options(gpu.triton_target().backend),
        "config": cfg.to_dict(),
        "problem": problem.to_dict(),
    }
    if problem.dtype == FP8:  # the bytes "fp8" means on this target (FNUZ or OCP e4m3)
        from rocmflash.static.space import fp8_format

        key["fp8_format"] = fp8_format(gpu)
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def compile_forward(target, cfg: KernelConfig, problem: Problem, gpu: GPU) -> tuple:
    """Cross-compile one forward config: the variant's kernels, or for an fp8 problem the fp8 forward.

    fp8: Q, K, V in ``gpu``'s e4m3 format (:func:`rocmflash.static.space.fp8_format`), bf16 output;
    the online variant only (``ValueError`` otherwise). Triton 3.6 keeps one AMD generation's fp8
    conversions per process (:func:`rocmflash.kernels.fp8.forward.compile_for` refuses a second), which
    holds in the sweep: each sweep targets one GPU and starts its own worker processes."""
    if problem.dtype != FP8:
        from rocmflash.kernels import get_variant

        return get_variant(cfg.variant).compile_for(target, cfg, problem)
    import torch

    from rocmflash.kernels.fp8 import forward as fp8_forward
    from rocmflash.static.space import fp8_format

    if cfg.variant != "online":
        raise ValueError(f"fp8 attention runs the online kernel only; got variant={cfg.variant!r}")
    out = dataclasses.replace(problem, dtype="bf16")  # fp8_forward's Problem.dtype is the output's
    return fp8_forward.compile_for(target, cfg, out, getattr(torch, fp8_format(gpu)))


class ObservationCache:
    """One JSON file per fingerprint under ``root/static-v<schema>/``; writes are atomic.

    Concurrent sweeps may write the same entry: each writes a private temporary file
    and renames it into place, so a reader sees either nothing or a whole entry. An
    unreadable entry counts as a miss (and is overwritten by the recompile).
    """

    def __init__(self, root: str):
        self.base = root
        self.root = os.path.join(root, f"static-v{CACHE_SCHEMA}")
        self.corrupt = 0

    def _path(self, key: str) -> str:
        return os.path.join(self.root, key[:2], key + ".json")

    def get(self, key: str) -> Optional[dict]:
        try:
            with open(self._path(key), encoding="utf-8") as f:
                record = json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            self.corrupt += 1
            return None
        if not isinstance(record, dict) or record.get("fingerprint") != key:
            self.corrupt += 1
            return None
        return record

    def put(self, key: str, record: dict) -> None:
        path = self._path(key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=os.path.dirname(path))
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(record, f)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise


@dataclasses.dataclass
class SweepStats:
    """What a sweep did: how many configs, how many compiled vs read from the cache, and how long."""

    configs: int = 0
    compiled: int = 0
    cache_hits: int = 0
    failed: int = 0
    corrupt_cache_entries: int = 0
    seconds: float = 0.0

    @property
    def configs_per_second(self) -> float:
        return self.configs / self.seconds if self.seconds > 0 else float("inf")


# ------------------------------------------------------------------ worker side
#: how much lower than the tune's own processes a compile worker runs (``os.nice``): during a live tune the compile
#: pool fills every core while the timing workers, whose host side launches and syncs every measurement, and the
#: scheduler need a core the moment they wake; a compile is throughput work that loses nothing by yielding to them
COMPILE_NICENESS = 10


def _worker_init(triton_cache_dir: str) -> None:
    # Workers only cross-compile: hide every GPU before torch can see one.
    for var in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
        os.environ[var] = ""
    os.environ["TRITON_CACHE_DIR"] = triton_cache_dir
    os.environ.pop("TRITON_INTERPRET", None)
    from rocmflash.hw.platform import lower_priority

    lower_priority(COMPILE_NICENESS)


def observe(task: dict) -> dict:
    """Compile one config for one GPU and read its code objects (runs in a worker).

    Returns the observation: per-kernel resource/occupancy summaries (main kernel
    first; on AMD each with the ``scratch_*`` fields read from the assembly: scratch
    loads/stores inside and outside loops, see :mod:`isa_tools.scratch`), a hash of
    the binaries, and the compile time. A compile error becomes ``status="failed"``
    with the error's first line.
    """
    from rocmflash.hw.gpus import get_gpu

    gpu = get_gpu(task["gpu"])
    record = {"fingerprint": task["fingerprint"], "config": task["config"], "problem": task["problem"],
              "gpu": gpu.name, "arch": gpu.arch}
    if task.get("family"):
        record["family"] = task["family"]
    start = time.perf_counter()
    try:
        if task.get("family"):  # another kernel family (decode, backward): its own compile entry
            from rocmflash.static.families import get_family

            compiled = get_family(task["family"]).compile_task(gpu.triton_target(), task["config"], task["problem"])
        else:
            cfg = KernelConfig.from_dict(task["config"])
            compiled = compile_forward(gpu.triton_target(), cfg, Problem.from_dict(task["problem"]), gpu)
    except Exception as err:  # a failed compile is data: record it and move on
        from rocmflash.messages import error_line

        record.update(status="failed", error=error_line(err),
                      kernels=[], binary_sha256=None)
    else:
        record.update(status="ok", error=None, kernels=[_summarize(k, gpu) for k in compiled],
                      binary_sha256=_binary_hash(compiled, gpu))
    record["compile_seconds"] = round(time.perf_counter() - start, 3)
    return record


def _binary_hash(compiled, gpu: GPU) -> str:
    digest = hashlib.sha256()
    for kernel in compiled:
        digest.update(kernel.asm["hsaco" if gpu.vendor == "amd" else "cubin"])
        digest.update(str(kernel.metadata.shared).encode())
    return digest.hexdigest()


def _summarize(kernel, gpu: GPU) -> dict:
    from isa_tools import kernel_summary, read_code_object
    from isa_tools.summary import cuda_kernel_summary

    meta = kernel.metadata
    if gpu.vendor == "amd":
        (resources,) = read_code_object(kernel.asm["hsaco"])
        summary = kernel_summary(resources, meta.shared, meta.num_warps, kernel.asm.get("amdgcn"))
    else:
        from isa_tools import read_cubin

        (resources,) = read_cubin(kernel.asm["cubin"])
        summary = cuda_kernel_summary(resources, meta.shared, meta.num_warps)
    summary.pop("path", None)
    return summary


# ------------------------------------------------------------------ parent side
def sweep(configs: list[KernelConfig], problem: Problem, gpu: GPU, cache_dir: Optional[str] = None,
          workers: Optional[int] = None, timeout_s: float = DEFAULT_TIMEOUT_S,
          on_result: Optional[Callable[[dict], None]] = None) -> tuple[list[dict], SweepStats]:
    """Observe every config: from the cache where possible, else by compiling in a process pool.

    Results come back in the order of ``configs``. ``on_result`` is called once per
    config as its observation becomes available (cache hits first), e.g. to advance a
    progress bar.
    """
    keys = [fingerprint(cfg, problem, gpu) for cfg in configs]
    tasks = [{"config": cfg.to_dict(), "problem": problem.to_dict()} for cfg in configs]
    return _observe_all(keys, tasks, gpu, cache_dir, workers, timeout_s, on_result)


def family_fingerprint(family, config: dict, problem: dict, gpu: GPU) -> str:
    """Cache key of one compile of a kernel family: its sources, Triton, target, options, config, problem."""
    import triton

    key = {"schema": CACHE_SCHEMA, "family": family.name, "source": family.source_hash(),
           "triton": triton.__version__, "target": _target_key(gpu),
           "options": family.compile_options(config, gpu.triton_target().backend), "config": config,
           "problem": problem}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def sweep_family(family_name: str, configs: list[dict], problem: dict, gpu: GPU, cache_dir: Optional[str] = None,
                 workers: Optional[int] = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                 on_result: Optional[Callable[[dict], None]] = None) -> tuple[list[dict], SweepStats]:
    """:func:`sweep` for a kernel family of :mod:`rocmflash.static.families` (configs and problem as dicts)."""
    from rocmflash.static.families import get_family

    family = get_family(family_name)
    keys = [family_fingerprint(family, cfg, problem, gpu) for cfg in configs]
    tasks = [{"family": family_name, "config": cfg, "problem": problem} for cfg in configs]
    return _observe_all(keys, tasks, gpu, cache_dir, workers, timeout_s, on_result)


def observe_family_config(family_name: str, config: dict, problem: dict, gpu: GPU,
                          cache_dir: Optional[str] = None) -> dict:
    """One observation of a family config, from the cache or compiled in this process (no worker pool).

    For run-time checks of a single config (:func:`rocmflash.api.build_check.usable_config`): the
    same fingerprint and cache as :func:`sweep_family`, so a check after a tune's static phase (or
    an earlier process's check) compiles nothing.
    """
    from rocmflash.static.families import get_family

    key = family_fingerprint(get_family(family_name), config, problem, gpu)
    cache = ObservationCache(cache_dir or default_cache_dir())
    record = cache.get(key)
    if record is None:
        record = observe({"family": family_name, "config": config, "problem": problem, "fingerprint": key,
                          "gpu": gpu.name})
        cache.put(key, record)
    return record


def _observe_all(keys: list, tasks: list, gpu: GPU, cache_dir, workers, timeout_s, on_result):
    """Observations for ``tasks`` (cache first, the rest compiled in a pool), in order, with stats."""
    start = time.perf_counter()
    cache = ObservationCache(cache_dir or default_cache_dir())
    stats = SweepStats(configs=len(tasks))
    results: list[Optional[dict]] = [cache.get(key) for key in keys]
    for record in results:
        if record is not None:
            stats.cache_hits += 1
            if on_result:
                on_result(record)
    missing = {i: dict(tasks[i], fingerprint=keys[i], gpu=gpu.name) for i, r in enumerate(results) if r is None}
    if missing:
        for i, record in _compile_in_pool(missing, cache.base, workers, timeout_s):
            if not record.get("transient"):  # a timeout or a dead worker may not recur: retry next time
                cache.put(keys[i], record)
            results[i] = record
            stats.compiled += 1
            if on_result:
                on_result(record)
    stats.failed = sum(1 for r in results if r["status"] != "ok")
    stats.corrupt_cache_entries = cache.corrupt
    stats.seconds = time.perf_counter() - start
    return results, stats


def triton_cache_dir(cache_root: Optional[str] = None) -> str:
    """Triton's cache of rocmflash's builds: ``<cache root>/triton`` (default root: :func:`default_cache_dir`).

    The static phase compiles into it and a live tune's runner launches from it. Triton
    keys a build by kernel source, argument types and specialisation, target and options,
    and the static phase compiles with the specialisation a launch of the tuned shape has
    (:func:`rocmflash.kernels.common.compile_kernel`), so a config it built for the live
    GPU's arch is found there at the first launch instead of being compiled a second time.
    ``rocmflash isa`` reads every code object a sweep produced from it.
    """
    return os.path.join(cache_root or default_cache_dir(), "triton")


def _compile_in_pool(tasks: dict, cache_root: str, workers: Optional[int], timeout_s: float):
    """Yield ``(index, observation)`` as compiles finish; a timed-out compile's worker is killed.

    Triton's own cache is :func:`triton_cache_dir` of ``cache_root``.
    """
    from concurrent.futures import as_completed

    import pebble

    workers = max(1, workers or os.cpu_count() or 1)
    context = multiprocessing.get_context("spawn")
    triton_cache = triton_cache_dir(cache_root)
    with pebble.ProcessPool(max_workers=min(workers, len(tasks)), context=context,
                            initializer=_worker_init, initargs=(triton_cache,)) as pool:
        futures = {pool.schedule(observe, args=(task,), timeout=timeout_s): i for i, task in tasks.items()}
        for future in as_completed(futures):
            i = futures[future]
            try:
                record = future.result()
            except FutureTimeout:
                record = _failure(tasks[i], f"compile timed out after {timeout_s:g} s (worker killed)")
            except Exception as err:  # the worker died (e.g. the compiler crashed the process)
                record = _failure(tasks[i], f"compile worker died: {type(err).__name__}: {err}")
            yield i, record


def _failure(task: dict, error: str) -> dict:
    from rocmflash.hw.gpus import get_gpu

    return {"fingerprint": task["fingerprint"], "config": task["config"], "problem": task["problem"],
            "gpu": task["gpu"], "arch": get_gpu(task["gpu"]).arch, "status": "failed", "error": error,
            "kernels": [], "binary_sha256": None, "compile_seconds": None, "transient": True}
