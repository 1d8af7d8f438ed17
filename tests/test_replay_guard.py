"""Kept launch plans are guarded: they call Triton's compiled-kernel runner, an internal that can move between
releases (``rocmflash.kernels.launch.launch_cached``).

A plan is kept only when the runner takes as many arguments as the plan passes; a replay that raises drops its
plan, the call goes through Triton's JIT launch, and one warning names the kernel. On the CPU the "compiled"
launch is Triton's interpreter running the kernel for real (so results are checked), returning a fake
``CompiledKernel`` whose runner the test decides; on a GPU the installed Triton's own runner must pass the check.
"""

import functools
import warnings

import pytest
import torch

from rocmflash.kernels import launch as L
from rocmflash.kernels.error_swap import swap


class _Source:
    def __init__(self, n_args):
        self.signature = {f"a{i}": "i32" for i in range(n_args)}  # Triton's ASTSource.signature: one per argument


class _Compiled:
    """A ``CompiledKernel`` stand-in: ``compiled[grid]`` is ``runner`` (``src``: a signature of ``n_args``)."""

    def __init__(self, runner, n_args=None):
        self.runner, self.replays = runner, []
        if n_args is not None:
            self.src = _Source(n_args)

    def __getitem__(self, grid):
        @functools.wraps(self.runner)  # (inspect.signature reads the runner's own parameters through it)
        def run(*args):
            self.replays.append(args)
            return self.runner(*args)
        return run


@pytest.fixture
def jit_runs_interpreted(monkeypatch):
    """Compiled launches that really run (the JIT launch interprets the kernel) and return ``make()``'s fake
    compiled kernel; yields ``(log of JIT launches, setter of make)``. No plan or JIT-only kernel from elsewhere."""
    log, made = [], {}

    def jit_launch(fn, grid, kwargs):
        log.append(fn.__name__)
        with L._jit_functions_interpreted():
            fn.interpreted[grid](**{name: kwargs[name] for name in fn.arg_names})
        return made["make"]()

    monkeypatch.setenv("TRITON_INTERPRET", "1")  # CPU tensors may be launched (error_swap asks) ...
    monkeypatch.setattr(L, "interpreting", lambda: False)  # ... and launch_cached takes its compiled path
    monkeypatch.setattr(L, "FAST_LAUNCH", True)
    monkeypatch.setattr(L, "_jit_launch", jit_launch)
    monkeypatch.setattr(L, "_is_compiled_kernel", lambda obj: isinstance(obj, _Compiled))
    monkeypatch.setattr(L, "_PLANS", {})
    monkeypatch.setattr(L, "_JIT_ONLY", set())
    monkeypatch.setattr(L, "_WARNED", set())
    return log, lambda make: made.__setitem__("make", make)


def _swap_checked():
    """One launch of the error-word exchange on fresh random values; asserts its result."""
    value = int(torch.randint(1, 2**31 - 1, (1,)))
    word, snapshot = torch.tensor([value], dtype=torch.int32), torch.tensor([-1], dtype=torch.int32)
    swap(word, snapshot)
    assert int(snapshot) == value and int(word) == 0


def _runtime_warnings(record):
    return [str(w.message) for w in record if issubclass(w.category, RuntimeWarning)]


def test_a_replay_that_raises_drops_its_plan_and_launches_through_the_jit_with_one_warning(jit_runs_interpreted):
    log, make = jit_runs_interpreted

    def runner(*args):  # what a Triton whose launcher takes other arguments answers
        raise TypeError(f"launch() takes 9 positional arguments but {len(args) + 9} were given")

    compiled = _Compiled(runner)  # no signature, a runner of *args: nothing to check when the plan is made
    make(lambda: compiled)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        _swap_checked()  # first launch: the JIT, a plan kept
        assert log == ["_swap_word"] and len(L._PLANS) == 1 and not record
        _swap_checked()  # the replay raises: dropped, the JIT launches, one warning
        assert len(compiled.replays) == 1 and log == ["_swap_word"] * 2 and not L._PLANS
        for _ in range(2):
            _swap_checked()  # the JIT from now on: no new plan, no second warning
    assert len(compiled.replays) == 1 and log == ["_swap_word"] * 4 and not L._PLANS
    texts = _runtime_warnings(record)
    assert len(texts) == 1, texts
    assert "kernel _swap_word" in texts[0] and "TypeError: launch() takes 9 positional arguments" in texts[0]


def test_a_replay_that_works_is_kept(jit_runs_interpreted):
    """The control: a runner of the plan's arity replays (and the plan gives it this call's tensors)."""
    log, make = jit_runs_interpreted
    from rocmflash.kernels.error_swap import _swap_word

    def runner(word, snapshot):  # stands in for the kernel, as the compiled one would run
        snapshot.copy_(word)
        word.zero_()

    compiled = _Compiled(runner, n_args=len(_swap_word.arg_names))
    make(lambda: compiled)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(3):
            _swap_checked()
    assert log == ["_swap_word"] and len(compiled.replays) == 2 and len(L._PLANS) == 1
    assert not _runtime_warnings(record)


@pytest.mark.parametrize("how", ["signature", "runner"])
def test_a_plan_whose_argument_count_differs_from_the_runner_is_not_kept(jit_runs_interpreted, how):
    """Checked when the plan is made: by the compiled source's signature, or without one by the runner's own
    positional parameters. The kernel then runs through the JIT, correctly, with one warning."""
    log, make = jit_runs_interpreted

    def three(word, snapshot, extra):  # one argument more than the kernel has
        raise AssertionError("never called: the plan is refused before any replay")

    compiled = _Compiled(lambda *args: None, n_args=3) if how == "signature" else _Compiled(three)
    make(lambda: compiled)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(3):
            _swap_checked()
    assert log == ["_swap_word"] * 3 and not L._PLANS and not compiled.replays
    texts = _runtime_warnings(record)
    assert len(texts) == 1 and "kernel _swap_word" in texts[0], texts
    assert "runner takes 3 arguments, the launch plan passes 2" in texts[0]


# ----------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.usefixtures("compiled")
def test_the_installed_triton_runner_passes_the_check_and_replays(monkeypatch):
    """On the real Triton every plan's arity matches its runner (no warning, the plan kept and replayed), and the
    exchange is right on the device, compiled."""
    monkeypatch.setattr(L, "FAST_LAUNCH", True)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(3):
            value = int(torch.randint(1, 2**31 - 1, (1,)))
            word = torch.tensor([value], dtype=torch.int32, device="cuda")
            snapshot = torch.full((1,), -1, dtype=torch.int32, device="cuda")
            swap(word, snapshot)
            assert int(snapshot) == value and int(word) == 0
    assert not _runtime_warnings(record)
    from rocmflash.kernels.error_swap import _swap_word

    assert id(_swap_word) not in L._JIT_ONLY
    assert any(key[0] == id(_swap_word) for key in L._PLANS)
