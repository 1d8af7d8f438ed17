"""Shared test fixtures for rocmflash.

Interpreter vs. compiler scheme: rocmflash's kernels are built as real ``JITFunction``s
with an interpreted twin (``rocmflash.kernels.common.kernel_jit``), and a launch reads
``TRITON_INTERPRET`` *at call time*. So nothing is set at import time here:

* CPU numerics tests request the ``interpret`` fixture (sets ``TRITON_INTERPRET=1`` for
  that test only, via monkeypatch) and run CPU tensors through Triton's interpreter.
* GPU tests are marked ``@pytest.mark.gpu``, skipped without ``torch.cuda.is_available()``,
  and request ``compiled`` (unsets ``TRITON_INTERPRET``) so the real compiler is used.
* Compile-only tests need neither: cross-compiling works in any process.
* ROCm-path tests request ``fake_rocm`` (``tests/fake_rocm.py``): torch and Triton report
  an AMD GPU (MI250 GCD, gfx90a by default) in this process and in every child Python,
  and kernels run in the interpreter.

One ``pytest`` run therefore covers all three on a GPU machine, and CI (no GPU) runs the
first and last kinds.
"""

import pytest
import torch


@pytest.fixture(autouse=True)
def _no_first_use_timing():
    """Tests exercise what they name: no run-time first-use timing (``rocmflash.api.first_use``), which would serve
    SDPA on a GPU wherever it measured faster, and would write decisions into the user's config directory. The
    tests of that decision turn it back on (``first_use_timing``). Not through ``monkeypatch``: an autouse fixture
    that requests it sets it up first, so it would undo every test's patches only after the other fixtures'
    teardowns ran (``fresh_decode`` clears a cache of a function a test may have patched)."""
    import os

    before = os.environ.get("ROCMFLASH_FIRST_USE_TIMING")
    os.environ["ROCMFLASH_FIRST_USE_TIMING"] = "0"
    yield
    if before is None:
        os.environ.pop("ROCMFLASH_FIRST_USE_TIMING", None)
    else:
        os.environ["ROCMFLASH_FIRST_USE_TIMING"] = before


@pytest.fixture
def first_use_timing(monkeypatch, tmp_path):
    """First-use timing on, its decisions (and any tuned database) in ``tmp_path/configs``."""
    monkeypatch.delenv("ROCMFLASH_FIRST_USE_TIMING", raising=False)
    monkeypatch.setenv("ROCMFLASH_CONFIG_DIR", str(tmp_path / "configs"))
    return tmp_path / "configs"


@pytest.fixture(scope="module")
def live():
    """The live GPU's catalog entry (GPU tests); skipped without a live GPU that is in the catalog."""
    from rocmflash.hw.detect import detect_live_gpu

    gpu = detect_live_gpu() if torch.cuda.is_available() else None
    if gpu is None:
        pytest.skip("needs a live GPU that is in the catalog")
    return gpu


@pytest.fixture
def run_cli_tune(tmp_path):
    """``run(args)``: ``rocmflash tune ARGS --cache-dir ...`` in a child process that writes its databases to
    ``tmp_path/configs`` (returned); fails the test with the output's tail unless it exits 0."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def run(args, timeout=540):
        configs = tmp_path / "configs"
        env = dict(os.environ, ROCMFLASH_CONFIG_DIR=str(configs), PYTHONUNBUFFERED="1")
        env.pop("ROCMFLASH_NO_DB", None)
        cmd = [sys.executable, "-m", "rocmflash.cli", "tune", *args, "--cache-dir", str(tmp_path / "cache")]
        done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        print(done.stdout[-1500:])
        return configs

    return run


def small_online_space(gpu):
    """A 8-config online space for GPU tune tests (one stage on AMD, as its default space)."""
    from rocmflash.static.space import DEFAULT_RESTRICTIONS, ConfigSpace

    stages = [1] if gpu.vendor == "amd" else [2, 3]
    return ConfigSpace({"online": {"BLOCK_M": [64, 128], "BLOCK_N": [32, 64], "num_warps": [4, 8],
                                   "num_stages": stages}}, DEFAULT_RESTRICTIONS)


@pytest.fixture
def fresh_selection(monkeypatch):
    """Run-time selection with the databases read afresh (no ``ROCMFLASH_NO_DB``, every cache cleared)."""
    from rocmflash.api import selection

    monkeypatch.delenv(selection.NO_DB_ENV, raising=False)
    selection.clear_cache()
    yield
    selection.clear_cache()


@pytest.fixture
def interpret(monkeypatch):
    """Run kernel launches in this test through Triton's CPU interpreter."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.fixture
def compiled(monkeypatch):
    """Make sure kernel launches in this test use the real compiler on a GPU."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA or ROCm GPU")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


@pytest.fixture
def fake_rocm(request, monkeypatch):
    """A fake ROCm GPU (``tests/fake_rocm.py``) in this process and in every child Python; kernels interpreted.

    Yields the :class:`fake_rocm.FakeROCm` in force (default: one MI250 GCD, gfx90a).
    Another device: ``@pytest.mark.parametrize("fake_rocm", [{"gcn_arch_name": "gfx942", ...}],
    indirect=True)``. Everything is undone after the test.
    """
    from fake_rocm import FakeROCm, fake_rocm_env, install

    from rocmflash.api import selection

    fake = FakeROCm(**getattr(request, "param", {}))
    for name, value in fake_rocm_env(fake).items():
        monkeypatch.setenv(name, value)
    patches = install(fake)
    selection.clear_cache()  # device identities are cached per device
    try:
        yield fake
    finally:
        patches.undo()
        selection.clear_cache()


def reference_attention(q, k, v, causal, scale):
    """fp64 attention (on q's device) with rocmflash's conventions; returns ``(out, lse)``.

    Bottom-right causal alignment (key j allowed for query i iff j <= i + Sk - Sq); rows
    with no allowed key get output 0 and LSE -inf; GQA by repeating K/V heads.
    """
    q, k, v = (x.double() for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    s = (q @ k.transpose(-1, -2)) * scale
    sq, sk = q.shape[2], k.shape[2]
    if causal:
        i = torch.arange(sq, device=q.device)[:, None]
        j = torch.arange(sk, device=q.device)[None, :]
        s = s.masked_fill(j > i + (sk - sq), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.nan_to_num(torch.exp(s - lse[..., None]), nan=0.0)
    return p @ v, lse


@pytest.fixture
def attention_reference():
    return reference_attention


def spy_on_incumbent(monkeypatch, record=lambda backend, causal: backend) -> list:
    """Every SDPA call the incumbent dispatch makes, ``record(backend, is_causal)`` each; the real SDPA still runs.
    The dispatch runs the plan's ready calls (:func:`rocmflash.api.incumbent.sdpa_server`, made when a plan is):
    the plans are forgotten now and when the test ends, so every plan made meanwhile is spied on."""
    from rocmflash.api import ops, selection

    calls, real = [], ops.sdpa_server

    def server(backend, causal, gqa):
        serve = real(backend, causal, gqa)
        if serve is None:
            return None

        def spied(q, k, v, scale):
            calls.append(record(backend, causal))
            return serve(q, k, v, scale)
        return spied

    selection.clear_cache()
    monkeypatch.setattr(ops, "sdpa_server", server)
    return calls


@pytest.fixture
def sdpa_spy(monkeypatch):
    """Every SDPA call the incumbent dispatch makes, as ``(backend, is_causal)``; the real SDPA still runs."""
    from rocmflash.api import selection

    calls = spy_on_incumbent(monkeypatch, lambda backend, causal: (backend, causal))
    yield calls
    monkeypatch.undo()
    selection.clear_cache()  # no plan keeps a spied call


def synthetic_task_result(task: dict, backward: bool) -> dict:
    """A deterministic worker-task result from the task's config: backward (dQ at one head split, dK/dV at two)
    or decode (three split counts)."""
    c = task["config"]
    base = 1.0 + 0.01 * c["BLOCK_N"] / 16 + 0.03 * c["num_warps"] + 0.001 * c.get("num_stages", 1)
    if backward:
        splits = (1,) if c["kernel"] == "dq" else (1, 2)
        times = {n: round(base * (0.9 if c["kernel"] == "dq" else 1.1) + 0.01 * n, 5) for n in splits}
    else:
        times = {n: round(base / 10 + 0.002 * n, 5) for n in (1, 2, 4)}
    return {"config": c, "status": "ok", "times_ms": times, "rel_err": 1e-3}


class _FakeCompiled:
    """Stands in for Triton's CompiledKernel: ``compiled[grid](*args)`` records the launch."""

    def __init__(self, log):
        self.log = log

    def __getitem__(self, grid):
        return lambda *args: self.log.append(("replay", grid, args))


@pytest.fixture
def fake_triton(monkeypatch):
    """Compiled launches on CPU tensors: the JIT launch and the replay are recorded, not run."""
    from rocmflash.kernels import launch as L

    log = []

    def jit_launch(fn, grid, kwargs):
        log.append(("jit", tuple(grid) + (1,) * (3 - len(grid)),
                    tuple(kwargs[name] for name in fn.arg_names)))
        return _FakeCompiled(log)

    monkeypatch.setattr(L, "interpreting", lambda: False)
    monkeypatch.setattr(L, "FAST_LAUNCH", True)
    monkeypatch.setattr(L, "_jit_launch", jit_launch)
    monkeypatch.setattr(L, "_is_compiled_kernel", lambda obj: isinstance(obj, _FakeCompiled))
    monkeypatch.setattr(L, "_PLANS", {})
    return log


@pytest.fixture
def poisoned(monkeypatch):
    """Every float torch.empty_like / torch.empty in the test (the kernels' outputs among them) starts as NaN, so a
    row a kernel forgets to write shows up."""
    real_like, real_empty = torch.empty_like, torch.empty

    def like(t, *a, **kw):
        x = real_like(t, *a, **kw)
        return x.fill_(float("nan")) if x.is_floating_point() else x

    def empty(*a, **kw):
        x = real_empty(*a, **kw)
        return x.fill_(float("nan")) if x.is_floating_point() else x

    monkeypatch.setattr(torch, "empty_like", like)
    monkeypatch.setattr(torch, "empty", empty)


@pytest.fixture
def fresh_decode():
    """No decode error bits or kept decode plans from another test, before and after this one (plans skip the
    arch check for a known signature)."""
    from rocmflash.api import decode as Dm
    from rocmflash.kernels.decode import host as KD
    from rocmflash.kernels.decode import checks as DC

    DC._ERROR_WORDS.clear()
    Dm.clear_cache()
    yield
    DC._ERROR_WORDS.clear()
    Dm.clear_cache()
