"""Launching kernels: through Triton's JIT, through a replay of an earlier launch, or interpreted.

:func:`launch_kernel` launches a ``@kernel_jit`` kernel (compiled, or on the CPU through Triton's
interpreter when ``TRITON_INTERPRET=1`` at call time); :func:`launch_cached` keeps a plan per
specialisation (:func:`launch_key`) and replays Triton's compiled runner without re-binding
arguments -- most of a launch's host cost; :func:`observe_launches` records launches for tests;
:func:`watch_compiles` hands first launches' compiled kernels to the run-time build check.
The interpreter needs two patches of Triton 3.6 (bf16 dots; Triton's own ``@jit`` helpers called
from an interpreted kernel), applied only around interpreted launches.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import operator
import os
import warnings
from typing import Any, NamedTuple, Optional

import triton
import triton.language as tl
from triton.language import core as _tl_core  # noqa: F401  (see _jit_functions_interpreted)
from triton.runtime.jit import JITFunction

from rocmflash.config import KernelConfig


def env_reader(name: str):
    """A no-argument function that reads ``name`` from ``os.environ`` as it is at each call: its value, or
    None when unset (the value is ``bytes`` on POSIX CPython, else ``str``: compare against both). There,
    ``os.environ`` keeps its values in the dict ``_data`` (bytes keys; ``setenv`` and ``monkeypatch`` write
    through it) and ``get`` of an unset name raises and catches a KeyError inside ``Mapping.get`` (~1 µs,
    once per launch); the reader is ``_data.get`` bound to the encoded name (a C call, no Python frame).
    Elsewhere (no ``_data`` dict, or keys not encoded as bytes): ``os.environ.get`` of the name."""
    data, encode = getattr(os.environ, "_data", None), getattr(os.environ, "encodekey", None)
    if isinstance(data, dict) and encode is not None and isinstance(encode(name), bytes):
        return functools.partial(data.get, encode(name))
    return functools.partial(os.environ.get, name)


def env_value(name: str):
    """``os.environ.get(name)`` (a ``str`` or None), through :func:`env_reader`'s dict read."""
    raw = _READERS.get(name) or _READERS.setdefault(name, env_reader(name))
    value = raw()
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value


_READERS: dict = {}
_TRITON_INTERPRET = env_reader("TRITON_INTERPRET")
_ON = ("1", "true", "on", "yes", b"1", b"true", b"on", b"yes")
_OFF = ("", "0", b"", b"0")


def interpreting() -> bool:
    """True when launches should go through Triton's CPU interpreter (``TRITON_INTERPRET=1``); read per call."""
    value = _TRITON_INTERPRET()
    if value is None or value in _OFF:
        return False
    # the usual spellings without a method call: torch.compile cannot trace bytes.lower (the value is bytes)
    return value in _ON or value.lower() in _ON

# ----------------------------------------------------------------------------- interpreter
_BF16_DOT_PATCHED = False


def _patch_interpreter_bf16_dot() -> None:
    """Work around Triton 3.6's interpreter multiplying bf16 dot operands as raw uint16.

    The interpreter stores bf16 as uint16 and ``create_dot`` calls ``np.matmul`` on that
    storage (garbage results). Widen bf16 operands to fp32 first -- exact, and what the
    tensor cores do (exact products, fp32 accumulation). Only the interpreter is touched.
    """
    global _BF16_DOT_PATCHED
    if _BF16_DOT_PATCHED:
        return
    import numpy as np
    from triton.runtime import interpreter as I

    original = I.InterpreterBuilder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        def widen(x):
            if x.dtype.scalar == tl.bfloat16:
                data = I._convert_float(x.data, tl.bfloat16, tl.float32, None).view(np.float32)
                return I.TensorHandle(data, tl.float32)
            return x

        return original(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    I.InterpreterBuilder.create_dot = create_dot
    _BF16_DOT_PATCHED = True


@contextlib.contextmanager
def _jit_functions_interpreted():
    """While an interpreted kernel runs, let *any* JITFunction it calls run interpreted.

    Triton's own ``@jit`` helpers (``tl.zeros``, ``tl.cdiv``, ...) are compiled-mode
    JITFunctions when triton was imported without ``TRITON_INTERPRET=1``; calling one
    raises "Cannot call @triton.jit'd outside of the scope of a kernel". The compiler
    never calls ``JITFunction.__call__`` (it inlines), so patching it for the duration
    of an interpreted launch changes nothing else.
    """
    from triton.runtime.interpreter import InterpretedFunction

    original = JITFunction.__call__

    def call(self, *args, **kwargs):
        twin = self.__dict__.get("_rocmflash_twin")
        if twin is None:
            twin = self.__dict__["_rocmflash_twin"] = InterpretedFunction(self.fn)
        return twin(*args, **kwargs)

    # Nested interpreted calls patch triton.language / triton.language.core without
    # undoing it; a leaked patch breaks later real compiles in this process. Patch both
    # modules here first and restore everything on the way out.
    from triton.runtime import interpreter as I

    scope = I._patch_lang(_interpreter_probe)
    if scope is None:  # Triton <= 3.5 patches for good and gives nothing to restore
        raise RuntimeError(f"rocmflash's CPU interpreter path (TRITON_INTERPRET=1) needs Triton >= 3.6; this is "
                           f"{triton.__version__} (compiled GPU launches are unaffected)")
    JITFunction.__call__ = call
    try:
        yield
    finally:
        JITFunction.__call__ = original
        scope.restore()


def _interpreter_probe():
    """Never called: its ``__globals__`` (this module: ``tl`` and ``_tl_core``) drive the patch scope."""


NO_SWITCH = contextlib.nullcontext()  #: what :func:`on_device` returns when no switch is needed


def on_device(t):
    """A context that makes ``t``'s GPU the current device for a launch (a no-op, the common case, when it is).

    Triton compiles, loads and launches on the *current* device; tensors on another GPU (HF
    ``device_map``, pipeline stages) would otherwise be launched there, which CUDA refuses
    ("cannot be accessed from Triton") and ROCm may fault on. Launch keys hold the tensor's
    device, so a replayed launch is always one made under this context on that device.
    """
    if t.is_cuda:
        import torch

        if t.get_device() != torch.cuda.current_device():
            return torch.cuda.device(t.device)
    return NO_SWITCH


def check_device(name: str, t) -> None:
    """Raise ``ValueError`` unless ``t`` can be run here: a CUDA/ROCm tensor, or a CPU one under the interpreter."""
    if t.is_cuda:  # the common case, without making a torch.device
        return
    kind = t.device.type
    if kind == "cuda" or (kind == "cpu" and interpreting()):
        return
    if kind == "meta":
        raise ValueError(f"{name} is on the meta device, which holds no data; rocmflash kernels need a CUDA or ROCm "
                         "GPU tensor (or a CPU tensor with TRITON_INTERPRET=1)")
    raise ValueError(f"{name} is on {t.device}; rocmflash kernels need a CUDA or ROCm GPU tensor "
                     "(or set TRITON_INTERPRET=1 to run CPU tensors through Triton's interpreter)")


_LAUNCH_OBSERVERS: list = []


@contextlib.contextmanager
def observe_launches():
    """Record every kernel launch made inside the block; yields the list of records.

    Each record is ``{"kernel", "backend", "options", "interpreted"}``: the compile
    options are those a compiled launch passes to Triton for that backend, also when the
    interpreter ran the kernel (so CPU tests see what a GPU launch would choose).
    """
    with _collecting(_LAUNCH_OBSERVERS) as seen:
        yield seen


@contextlib.contextmanager
def _collecting(registry: list):
    """A fresh list registered in ``registry`` for the block (launches append their records to every registered
    list), unregistered after it."""
    seen: list = []
    registry.append(seen)
    try:
        yield seen
    finally:
        registry.remove(seen)


class CompiledLaunch(NamedTuple):
    """A launch that :func:`watch_compiles` saw: the kernel's name, the config it was launched with, and Triton's
    ``CompiledKernel`` (None for an interpreted launch, which compiles nothing)."""

    kernel: str
    cfg: Any
    compiled: Any


_COMPILE_WATCHERS: list = []


@contextlib.contextmanager
def watch_compiles():
    """Record, as :class:`CompiledLaunch` rows, every launch inside the block that went through Triton's JIT (a
    first launch: it compiled, or took the kernel from Triton's cache) or the interpreter; a replayed plan is not
    seen. For the run-time build check (:mod:`rocmflash.api.build_check`), which reads the kernel Triton compiled
    anyway. Unlike :func:`observe_launches`, it does not take launches off their fast path."""
    with _collecting(_COMPILE_WATCHERS) as seen:
        yield seen


def _report_compile(fn, cfg, compiled) -> None:
    for seen in _COMPILE_WATCHERS:
        seen.append(CompiledLaunch(getattr(fn, "__name__", repr(fn)), cfg, compiled))


#: reuse compiled kernels through :func:`launch_cached`'s own cache (False: every launch
#: goes through ``JITFunction.run``); ``ROCMFLASH_JIT_LAUNCH=1`` turns it off at import
FAST_LAUNCH = os.environ.get("ROCMFLASH_JIT_LAUNCH", "0") in ("", "0")
_PLANS: dict = {}  # launch key -> _LaunchPlan
_MAX_PLANS = 4096
#: ids of kernels launched through Triton's JIT only: their runner refused a plan's arguments (:func:`_jit_only`)
_JIT_ONLY: set = set()
MAX_INT32 = 2**31 - 1  #: largest storage (bytes) Triton gives 32-bit buffer addressing on AMD (the 2 GiB bit of a key)


def fits_buffer_addressing(t) -> bool:
    """Whether ``t``'s whole storage fits Triton's 32-bit buffer addressing on AMD (:data:`MAX_INT32` bytes): the
    "2 GiB bit" a launch is specialised on there, so every key of a ROCm launch or plan holds it per tensor."""
    return t.untyped_storage().nbytes() <= MAX_INT32


class _LaunchPlan(NamedTuple):
    """A compiled launch ready to replay: Triton's runner for one grid, the argument list in
    kernel order with the tensors left out, and where each tensor of the call goes. ``pick``: when
    the tensor arguments lead the argument list (every rocmflash kernel), one C call that picks them
    from the call's tensors in order (``tail``: the rest of the list); else None (``slots`` fill it)."""

    runner: Any
    template: tuple
    slots: tuple  # ((position in the argument list, index in the call's tensors), ...)
    pick: Any = None
    tail: tuple = ()
    loose_at: tuple = ()  #: positions of the kernel's unspecialised integers (in ``tail`` when ``pick``)
    loose: tuple = ()  #: their values in ``template`` (a call with the same values replays it unchanged)
    compiled: Any = None  #: Triton's CompiledKernel, for a caller whose grid changes from call to call
    grid: tuple = ()  #: ``runner``'s grid (3 dimensions)
    runners: Any = None  #: dict: other grids -> Triton's runner for that grid (made on first use)


def _jit_launch(fn, grid, kwargs: dict):
    """One launch through ``JITFunction.run`` (compiles on first use); returns Triton's ``CompiledKernel``."""
    return fn[grid](**kwargs)


def _is_compiled_kernel(obj) -> bool:
    from triton.compiler import CompiledKernel

    return isinstance(obj, CompiledKernel)


def launch_key(fn, scalars, tensors: tuple, cfg: KernelConfig, backend: str, loose_tensors: tuple = ()) -> tuple:
    """What decides the compiled binary, grid and argument values of a launch, conservatively.

    Triton specialises a launch on each tensor's dtype and 16-byte alignment (and, on AMD,
    on whether its storage fits 2 GiB: buffer loads), on integer values (``== 1``,
    divisible by 16) and on the constexprs and options. The key holds, per tensor, its
    dtype, shape, strides, 16-byte alignment and (on ``hip``) the 2 GiB bit, plus the
    device, the config and the caller's ``scalars`` (every non-tensor input of the launch):
    the integer arguments are functions of these, so a new shape, stride or scalar misses
    and goes through Triton once, never onto another specialisation or stale values.

    ``loose_tensors``: indices of tensors whose shape and strides reach the kernel only through
    its unspecialised integers (``fn.unspecialised``, passed per call as ``launch_cached``'s
    ``loose``) or through what the caller put in ``scalars``: the key holds their dtype,
    alignment and 2 GiB bit only, so one plan serves every size of them.

    The key also holds which arguments are one tensor (:func:`alias_pattern`): a plan puts each call's tensors
    into the slots the first call's took, so a plan made where ``cu_seqlens_q is cu_seqlens_k`` must never serve
    a call of two tensors (it would pass the first in both places).
    """
    # (kernels live for the process: id is stable)
    parts = [id(fn), cfg, backend, scalars, tensors[0].get_device(), alias_pattern(tensors)]
    hip = backend == "hip"
    for i, t in enumerate(tensors):
        if loose_tensors and i in loose_tensors:
            parts += (t.dtype, t.data_ptr() % 16 == 0)
        else:
            parts += (t.dtype, t.shape, t.stride(), t.data_ptr() % 16 == 0)
        if hip:
            parts.append(fits_buffer_addressing(t))
    return tuple(parts)


def alias_pattern(tensors) -> tuple:
    """``()`` when the tensors are distinct objects (the usual call: about 0.7 µs for 12 tensors), else, per
    tensor, the index of its first occurrence: ``(0, 0)`` for ``(cu, cu)``. ``None`` entries count as objects."""
    ids = list(map(id, tensors))
    if len({*ids}) == len(ids):
        return ()
    return tuple(map(ids.index, ids))


class KeptKey(tuple):
    """A :func:`launch_key` that hashes once, for a caller that keeps a key across many launches
    (``kv_decode.launch``): hashing a key hashes the dataclasses in it, in Python, on every lookup.
    Equal to, and hashing like, the plain key, so either finds the other's plan."""

    def __new__(cls, key: tuple):
        self = super().__new__(cls, key)
        self._hash = tuple.__hash__(self)
        return self

    def __hash__(self) -> int:
        return self._hash


def kept_key(keys: Optional[dict], slot: tuple, fn, scalars: tuple, tensors: tuple, cfg: KernelConfig, backend: str,
             loose_tensors: tuple = ()):
    """The launch key of ``fn`` from the caller's ``keys`` at ``slot``, computed and kept on first use; None
    (:func:`launch_cached` computes it) without ``keys`` or when a tensor is not 16-byte aligned.
    ``loose_tensors``: :func:`launch_key`'s.

    ``keys`` is a dict a caller keeps for launches whose tensors keep their dtypes, shapes, strides, device
    (and ROCm storage side of 2 GiB) -- the caller's promise, e.g. one dict per checked call signature
    (``flash_attn_with_kvcache``, the fp8 forward's kept plans). Kept keys are those of all-aligned launches
    only: under that promise alignment is all that can differ, so an aligned launch's key equals the kept
    one. ``slot`` names the kernel and every scalar that varies under the promise, so one dict never hands a
    key to another launch. The promise includes which arguments are one tensor (:func:`alias_pattern`, which
    the key holds): a caller's signature holds it (``api.decode._signature``, ``api.fp8_plans.signature``).
    """
    if keys is None:
        return None
    for t in tensors:
        if t.data_ptr() % 16:
            return None
    key = keys.get(slot)
    if key is None:
        key = keys[slot] = KeptKey(launch_key(fn, scalars, tensors, cfg, backend, loose_tensors))
    return key


def seen_before(seen: set, sig, limit: int) -> bool:
    """Whether ``sig`` is in ``seen`` (by hash) from an earlier call; adds it otherwise (``seen`` emptied at ``limit``).

    Callers keep a call's plan from its signature's second call on (``flash_attn_with_kvcache``, the fp8 forward).
    A cache one key longer each call (transformers' generate without ``cache_seqlens``) makes a new signature per
    call: keeping a plan for each would only add objects that live long enough for the garbage collector to scan
    them again and again (``archive/reports:bench/host_profile.py --cpu-stub --case decode``, that row: about 100 µs a call instead
    of 50). Hashes are ints, which it never scans; a collision only keeps a plan early (the plans' dict compares
    whole signatures).
    """
    h = hash(sig)
    if h in seen:
        return True
    if len(seen) >= limit:
        seen.clear()
    seen.add(h)
    return False


def _make_plan(fn, grid, args: dict, constexprs: dict, tensors: tuple, compiled,
               loose: bool = False) -> Optional[_LaunchPlan]:
    """A plan from a first launch, or None when some tensor argument is not one of ``tensors``
    (its value could change between calls with the same key: never replay it). ``loose``: the
    kernel's unspecialised integers are filled in per call (their positions are kept)."""
    import torch

    template, slots = [], []
    for position, name in enumerate(fn.arg_names):
        value = args[name] if name in args else constexprs[name]
        if isinstance(value, torch.Tensor):
            index = next((i for i, t in enumerate(tensors) if t is value), None)
            if index is None:
                return None
            slots.append((position, index))
            value = None
        template.append(value)
    grid3 = (tuple(grid) + (1, 1))[:3]  # CompiledKernel launches take all three grid dimensions
    runner = compiled[grid3]
    mismatch = _arity_mismatch(compiled, runner, len(template))
    if mismatch is not None:
        _jit_only(fn, mismatch)
        return None
    loose_at = tuple(fn.arg_names.index(name) for name in fn.unspecialised) if loose else ()
    loose_values = tuple(template[at] for at in loose_at)
    pick = None
    if slots and all(position == i for i, (position, _) in enumerate(slots)) and \
            all(at >= len(slots) for at in loose_at):
        indices = [index for _, index in slots]
        pick = operator.itemgetter(*indices) if len(indices) > 1 else (lambda ts, i=indices[0]: (ts[i],))
        loose_at = tuple(at - len(slots) for at in loose_at)
    return _LaunchPlan(runner, tuple(template), tuple(slots), pick, tuple(template[len(slots):]), loose_at,
                       loose_values, compiled, grid3, {})


def _runner_arity(compiled, runner) -> Optional[int]:
    """How many kernel arguments Triton's ``runner`` of ``compiled`` takes, where the installed Triton tells:
    the compiled source's signature (3.0-3.6: one entry per kernel argument, constexprs included, the list
    ``JITFunction.run`` passes), else the runner's own positional parameters; None where neither says
    (a runner of ``*args`` and no signature: the replay guard of :func:`launch_cached` is all there is)."""
    signature = getattr(getattr(compiled, "src", None), "signature", None)
    if isinstance(signature, dict):
        return len(signature)
    try:
        params = inspect.signature(runner).parameters.values()
    except (TypeError, ValueError):  # a builtin or C runner without introspection
        return None
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return None
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty for p in params)


def _arity_mismatch(compiled, runner, count: int) -> Optional[str]:
    """Why ``runner`` cannot replay a plan of ``count`` arguments (its arity differs), or None (it can, or nothing
    says otherwise). Plans call Triton's runner directly, an internal that can move between releases."""
    arity = _runner_arity(compiled, runner)
    if arity is None or arity == count:
        return None
    return (f"Triton {triton.__version__}'s compiled-kernel runner takes {arity} arguments, the launch plan "
            f"passes {count}")


_WARNED: set = set()  #: ids of the kernels :func:`_jit_only` warned of (once per kernel and process)


def _jit_only(fn, why: str) -> None:
    """Launch ``fn`` through Triton's JIT from now on (no plan is kept for it), and warn once saying why."""
    _JIT_ONLY.add(id(fn))
    if id(fn) not in _WARNED:
        _WARNED.add(id(fn))
        name = getattr(fn, "__name__", repr(fn))
        warnings.warn(f"rocmflash: kernel {name} is launched through Triton's JIT (slower on the host, same "
                      f"results) instead of a kept launch plan: {why}", RuntimeWarning, stacklevel=3)


_MAX_RUNNERS = 256  #: grids kept per plan (a packed batch's grid follows its longest sequence): then started over


def _runner(plan: _LaunchPlan, grid: tuple):
    """Triton's runner of ``plan`` for ``grid``: the plan's own for its grid, else one per grid, kept."""
    grid3 = (tuple(grid) + (1, 1))[:3]
    if grid3 == plan.grid:
        return plan.runner
    runner = plan.runners.get(grid3)
    if runner is None:
        if len(plan.runners) >= _MAX_RUNNERS:
            plan.runners.clear()
        runner = plan.runners[grid3] = plan.compiled[grid3]
    return runner


def launch_cached(fn: JITFunction, scalars, tensors: tuple, build, cfg: KernelConfig, backend: str,
                  key: Optional[tuple] = None, loose: tuple = (), loose_tensors: tuple = (),
                  grid: Optional[tuple] = None) -> None:
    """Launch ``fn`` with the arguments ``build()`` returns as ``(grid, args, constexprs)``,
    building them only on the first launch of each specialisation.

    ``tensors`` are every tensor argument of the launch, and ``scalars`` (hashable) every
    other input ``build`` reads: together with the config they decide the grid, the
    arguments and Triton's specialisation (:func:`launch_key`). The first launch of a key
    goes through ``JITFunction.run`` and leaves a :class:`_LaunchPlan`; later launches put
    this call's tensors into the saved argument list and call Triton's cached runner
    (``CompiledKernel[grid](*args)``, its launch API since 3.0), which skips the argument
    binding and the per-call argument dictionaries: most of a launch's host cost. Under the
    interpreter, with ``observe_launches`` active or with ``FAST_LAUNCH`` off this is
    :func:`launch_kernel`.

    ``key``: this launch's :func:`launch_key`, when the caller kept it from an earlier launch
    and knows that nothing the key reads has changed since (see ``kv_decode.launch``);
    computing the key is a large part of a cached launch's cost. None: computed here.

    ``loose``: the values of ``fn``'s unspecialised integers (``fn.unspecialised``, in that order),
    for a caller whose key leaves out the sizes they come from (``loose_tensors``, as
    :func:`launch_key` takes them, for the key computed here): a replay puts this call's values in
    their places, so one plan serves a KV cache one key longer each call. Triton compiles one binary
    for every value of such an argument (of one integer width: the caller's scalars hold the width).

    ``grid``: this call's grid, for a caller whose key leaves out what decides it (a packed varlen batch: its
    sequence count and longest sequence); a replay then runs Triton's runner for it. None: the plan's grid.

    Plans call Triton's runner, an internal that can move between releases, so they are guarded: a plan is
    made only when the runner takes as many arguments as it passes (:func:`_arity_mismatch`), and a replay
    that raises drops its plan and the call goes through the JIT launch. Either way the kernel is launched
    through the JIT from then on, with one ``RuntimeWarning`` naming it and why (:func:`_jit_only`).
    """
    if not FAST_LAUNCH or _LAUNCH_OBSERVERS or interpreting():
        grid, args, constexprs = build()
        launch_kernel(fn, grid, args, constexprs, cfg, backend)
        return
    if key is None:
        key = launch_key(fn, scalars, tensors, cfg, backend, loose_tensors)
    plan = _PLANS.get(key)
    failed = None
    if plan is not None:
        try:  # (free unless it raises: a Triton whose runner takes other arguments than the plan passes)
            runner = plan.runner if grid is None else _runner(plan, grid)
            if plan.pick is not None:
                if not loose or loose == plan.loose:  # (a cache a model keeps: the values the plan was made with)
                    runner(*plan.pick(tensors), *plan.tail)
                    return
                tail = list(plan.tail)
                for at, value in zip(plan.loose_at, loose):
                    tail[at] = value
                runner(*plan.pick(tensors), *tail)
                return
            call = list(plan.template)
            for position, index in plan.slots:
                call[position] = tensors[index]
            for position, value in zip(plan.loose_at, loose):
                call[position] = value
            runner(*call)
            return
        except Exception as err:  # drop the plan; this call goes through Triton's JIT below (ROCMFLASH_JIT_LAUNCH's)
            _PLANS.pop(key, None)
            failed = err
    grid, args, constexprs = build()
    compiled = _jit_launch(fn, grid, {**args, **constexprs, **compile_options(cfg, backend)})
    if _COMPILE_WATCHERS:  # (a first launch only: a replay above never gets here)
        _report_compile(fn, cfg, compiled)
    if failed is not None:  # the JIT launched what the replay could not: the plan was at fault, not the call
        _jit_only(fn, f"its plan's replay raised {type(failed).__name__}: {failed}")
    elif _is_compiled_kernel(compiled) and len(_PLANS) < _MAX_PLANS and id(fn) not in _JIT_ONLY:
        plan = _make_plan(fn, grid, args, constexprs, tensors, compiled, bool(loose))
        if plan is not None:
            _PLANS[key] = plan


def launch_kernel(fn: JITFunction, grid, args: dict, constexprs: dict, cfg: KernelConfig, backend: str):
    """Launch ``fn`` (compiled, or interpreted when TRITON_INTERPRET=1) with keyword arguments.

    The compile options are chosen the same way in both modes (AMD-only names on ``hip``
    only); the interpreter has no compiler, so it is not given them. Every compiled launch
    goes through ``JITFunction.run``; hot paths use :func:`launch_cached`.
    """
    options = compile_options(cfg, backend)
    interp = interpreting()
    for seen in _LAUNCH_OBSERVERS:
        seen.append({"kernel": fn.__name__, "backend": backend, "options": dict(options), "interpreted": interp})
    if interp:
        _patch_interpreter_bf16_dot()
        with _jit_functions_interpreted():
            fn.interpreted[grid](**args, **constexprs)
        compiled = None
    else:
        compiled = _jit_launch(fn, grid, {**args, **constexprs, **options})
    if _COMPILE_WATCHERS:
        _report_compile(fn, cfg, compiled)


@functools.lru_cache(maxsize=4096)
def compile_options(cfg: KernelConfig, backend: str) -> dict:
    """``cfg.compile_options(backend)``, computed once per config (callers must not mutate it)."""
    return cfg.compile_options(backend)
