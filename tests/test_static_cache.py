"""The compile cache: miss then hit, corrupt entries, concurrent sweeps and writers."""

import json
import multiprocessing
import os

from rocmflash.config import KernelConfig, Problem
from rocmflash.hw.gpus import get_gpu
from rocmflash.static.compile import CACHE_SCHEMA, ObservationCache, fingerprint, sweep

PROBLEM = Problem(head_dim=64)
CONFIGS = [KernelConfig(BLOCK_M=64, BLOCK_N=32, num_warps=4), KernelConfig(BLOCK_M=64, BLOCK_N=64, num_warps=4),
           KernelConfig(BLOCK_M=128, BLOCK_N=32, num_warps=4)]


def _entries(cache_dir):
    return [os.path.join(root, f) for root, _, files in os.walk(os.path.join(cache_dir, f"static-v{CACHE_SCHEMA}"))
            for f in files if f.endswith(".json")]


def test_miss_then_hit_then_corrupt(tmp_path):
    gpu = get_gpu("mi250")
    cold, stats = sweep(CONFIGS, PROBLEM, gpu, cache_dir=str(tmp_path), workers=2)
    assert (stats.compiled, stats.cache_hits) == (3, 0)
    assert all(o["status"] == "ok" for o in cold)
    warm, stats = sweep(CONFIGS, PROBLEM, gpu, cache_dir=str(tmp_path), workers=2)
    assert (stats.compiled, stats.cache_hits) == (0, 3)
    assert warm == cold
    # A different target or problem is a different key: no false hit.
    assert fingerprint(CONFIGS[0], PROBLEM, gpu) != fingerprint(CONFIGS[0], PROBLEM, get_gpu("mi300x"))
    assert fingerprint(CONFIGS[0], PROBLEM, gpu) != fingerprint(CONFIGS[0], Problem(head_dim=128), gpu)
    # Corrupt one entry (truncated JSON) and make another name the wrong key: both recompile.
    entries = sorted(_entries(str(tmp_path)))
    assert len(entries) == 3
    with open(entries[0], "w") as f:
        f.write('{"fingerprint": "abc", "sta')
    with open(entries[1]) as f:
        record = json.load(f)
    record["fingerprint"] = "not-this-one"
    with open(entries[1], "w") as f:
        json.dump(record, f)
    healed, stats = sweep(CONFIGS, PROBLEM, gpu, cache_dir=str(tmp_path), workers=2)
    assert stats.corrupt_cache_entries == 2 and stats.compiled == 2 and stats.cache_hits == 1
    assert [o["binary_sha256"] for o in healed] == [o["binary_sha256"] for o in cold]
    _, stats = sweep(CONFIGS, PROBLEM, gpu, cache_dir=str(tmp_path), workers=2)
    assert stats.compiled == 0 and stats.corrupt_cache_entries == 0


def _sweep_in_process(cache_dir, queue):
    _, stats = sweep(CONFIGS, PROBLEM, get_gpu("mi250"), cache_dir=cache_dir, workers=1)
    queue.put(stats.compiled)


def test_concurrent_sweeps_share_a_cache(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_sweep_in_process, args=(str(tmp_path), queue)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
        assert p.exitcode == 0
    assert sorted(queue.get() for _ in procs)[-1] <= 3
    for path in _entries(str(tmp_path)):
        with open(path) as f:
            json.load(f)  # every entry is whole
    _, stats = sweep(CONFIGS, PROBLEM, get_gpu("mi250"), cache_dir=str(tmp_path), workers=1)
    assert stats.compiled == 0


def _hammer(root, key, payload_size, rounds):
    cache = ObservationCache(root)
    for i in range(rounds):
        cache.put(key, {"fingerprint": key, "writer": os.getpid(), "i": i, "pad": "x" * payload_size})


def test_concurrent_writers_never_leave_a_partial_entry(tmp_path):
    key = "ab" + "0" * 62
    ctx = multiprocessing.get_context("spawn")
    writers = [ctx.Process(target=_hammer, args=(str(tmp_path), key, 200_000, 40)) for _ in range(3)]
    for w in writers:
        w.start()
    reader = ObservationCache(str(tmp_path))
    seen = 0
    while any(w.is_alive() for w in writers):
        record = reader.get(key)
        if record is not None:
            assert len(record["pad"]) == 200_000
            seen += 1
    for w in writers:
        w.join()
        assert w.exitcode == 0
    assert reader.corrupt == 0 and reader.get(key) is not None
    leftovers = [f for f in os.listdir(os.path.dirname(reader._path(key))) if f.startswith(".tmp-")]
    assert leftovers == []


def test_cache_key_covers_every_forward_kernel_source():
    """Every rocmflash module a forward variant imports must be part of the cache key."""
    import subprocess
    import sys

    # paths relative to the child's own rocmflash (an installed wheel or this checkout, whichever it imports)
    code = ("import os, sys, rocmflash\nfrom rocmflash.kernels import registry\nregistry()\n"
            "root = os.path.dirname(rocmflash.__file__)\n"
            "print('\\n'.join(os.path.relpath(m.__file__, root) for n, m in sys.modules.items() "
            "if n.startswith('rocmflash.') and getattr(m, '__file__', None)))")
    files = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    from rocmflash.static.compile import FORWARD_SOURCES

    # the catalog and the torch/Triton version check shape no kernel
    imported = set(files) - {"__init__.py", "_version.py", "hw/__init__.py", "hw/gpus.py", "hw/compat.py"}
    assert imported <= set(FORWARD_SOURCES), imported - set(FORWARD_SOURCES)


def test_cache_key_follows_the_launch_attributes(monkeypatch):
    """AMDGCN_USE_BUFFER_OPS=0 makes Triton's AMD backend compile global loads instead of buffer loads (other
    registers): an observation cached under one setting must not answer for the other. NVIDIA has no such knob."""
    cfg, problem = KernelConfig(), Problem()
    amd, nvidia = get_gpu("mi300x"), get_gpu("h100")
    monkeypatch.delenv("AMDGCN_USE_BUFFER_OPS", raising=False)
    buffer_loads = fingerprint(cfg, problem, amd), fingerprint(cfg, problem, nvidia)
    monkeypatch.setenv("AMDGCN_USE_BUFFER_OPS", "0")
    assert fingerprint(cfg, problem, amd) != buffer_loads[0]
    assert fingerprint(cfg, problem, nvidia) == buffer_loads[1]
