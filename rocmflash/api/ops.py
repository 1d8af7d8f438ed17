"""rocmflash attention as ``torch.library`` custom ops: fake impls, autograd, torch.compile.

Two ops (and, for attention sinks, a third: below), all functional (no input is mutated, outputs never
alias inputs):

``torch.ops.rocmflash.attn_fwd(q, k, v, causal, scale, variant, config) -> (out, lse)``
    ``q (B, Hq, Sq, D)``, ``k/v (B, Hkv, Sk, D)`` (any strides), ``config`` a
    :class:`~rocmflash.config.KernelConfig` as JSON, or ``""`` to select one at run time
    (:func:`rocmflash.api.selection.select_config`: the live GPU's database entry, else the
    per-arch default). ``out`` is ``(B, Hq, Sq, D)``; its memory is ``(B, S, H, D)`` when q
    is a transposed view of a contiguous ``(B, S, H, D)`` tensor (HF and flash-attn
    layouts: transposing back is free), else contiguous. ``lse`` is fp32 ``(B, Hq, Sq)``.

``torch.ops.rocmflash.attn_bwd(dout, q, k, v, out, lse, dlse, causal, scale) -> (dq, dk, dv)``
    The Triton backward (:mod:`rocmflash.kernels.backward.host`); ``dlse`` is optional.

Attention sinks (gpt-oss): ``attn_fwd`` takes an optional last argument ``sinks``, fp32 ``(Hq,)`` logits
joined to each row's softmax denominator (the LSE includes them; ``online`` variant only). Its backward is
``torch.ops.rocmflash.attn_bwd_sinks(dout, q, k, v, out, lse, dlse, sinks, causal, scale) -> (dq, dk, dv,
dsinks)``: the same kernels plus the sinks' gradient, on the device. A call with sinks never runs SDPA nor the
decode kernel (neither has sinks): always the online kernel.

The forward op has an autograd formula (``register_autograd``) that calls the backward op,
so both eager autograd and ``torch.compile`` (AOTAutograd) see a differentiable op. Fake
implementations allocate outputs with the same layout rule, so ``torch.compile(...,
fullgraph=True)`` traces through without graph breaks; Inductor treats the ops as opaque
calls and runs the real kernels (which pick their config at run time).

Input validation lives in :mod:`rocmflash.api.attention` (the public functions); :func:`attention_op`
here is the thin differentiable entry used by the API, :mod:`rocmflash.api.sdpa` and
:mod:`rocmflash.integrations.hf`. A default call (online variant, no config) is decided once per
signature -- output layout, decode or not, the entry's incumbent, the forward and backward configs --
in a :class:`_Call` found by one dict lookup, so a repeat call's host time between its arguments and
its launch (or the incumbent SDPA) is a few attribute reads (``archive/reports:bench/host_profile.py --cpu-stub``).
"""

from __future__ import annotations

import contextlib
import functools
import math
from typing import Optional

import torch

from rocmflash.config import KernelConfig
from rocmflash.kernels import get_variant
from rocmflash.kernels.backward.host import backward, empty_like_layout
from rocmflash.kernels import launch as L
from rocmflash.api.decode import attend_whole_cache
from rocmflash.kernels.decode.shape import is_decode_shaped
from rocmflash.api.scale import fold_scale_sign
from rocmflash.api import selection as _selection
from rocmflash.api.incumbent import (DEFAULT, decode_host_floor, decode_timing, decode_winner, fell_back,
                                     first_call, refusal_problem, sdpa_causal, sdpa_server, shape_excludes)
from rocmflash.api import first_use
from rocmflash.api.host_bound import call_incumbents, timed_sides
from rocmflash.api.selection import incumbent_disabled, register_clear, select_bwd_config, select_config


def _fresh_out(q: torch.Tensor) -> torch.Tensor:
    return empty_like_layout(q)


def _lse_empty(q: torch.Tensor) -> torch.Tensor:
    B, H, S, _ = q.shape
    return torch.empty((B, H, S), dtype=torch.float32, device=q.device)


def _device_ctx(t):
    """Make ``t``'s GPU current for the launch (a no-op when it is): :func:`rocmflash.kernels.launch.on_device`."""
    return L.on_device(t)


# ----------------------------------------------------------------------------- per-call plans
class _Call:
    """Everything a default call (``variant="online"``, no config) decides from its shapes, dtype, device and
    causal flag, made once per such signature (:func:`_call_plan`) so that a repeat call pays one dict lookup
    between its arguments and its launch (or the incumbent SDPA). ``cfg`` and ``bwd_cfg`` are filled on the
    first launch and the first backward (:func:`select_config` is never asked for a call SDPA serves).

    The first served call of each side is guarded (:func:`rocmflash.api.incumbent.first_call`): where SDPA
    refuses it, the side falls back to rocmflash's kernels for good (one warning); once it ran, the unguarded call
    is swapped in. :meth:`pin` (the tune's timing routes) serves a backend unguarded: a refusal raises."""

    __slots__ = ("device", "out_stride", "lse_shape", "lse_stride", "empty", "decode", "gqa", "_incumbent",
                 "_incumbent_train", "sdpa_causal", "cfg", "bwd_cfg", "kv_layout", "scale", "serve", "serve_train",
                 "serving", "causal", "problem", "pinned")

    def __init__(self, device, out_stride: tuple, lse_shape: tuple, empty: bool, decode: bool, gqa: bool,
                 incumbent: Optional[str], incumbent_train: Optional[str], sdpa_causal: bool = False,
                 causal: bool = False, problem: tuple = ()):
        self.device = device
        self.gqa = gqa
        self.sdpa_causal = sdpa_causal  #: SDPA's ``is_causal`` for this call (one query token: False)
        self.causal = causal  #: rocmflash's causal flag (a fallback from SDPA runs rocmflash's kernel with it)
        self.problem = problem  #: what a refusal of SDPA falls back for (:func:`refusal_problem`)
        self.pinned = False  #: :meth:`pin` set the sides: SDPA unguarded
        self.out_stride = out_stride  #: the strides of ``empty_like_layout(q)``, allocated by ``torch.empty_strided``
        self.lse_shape, self.lse_stride = lse_shape, (lse_shape[1] * lse_shape[2], lse_shape[2], 1)
        self.empty = empty  #: no output rows or no keys: nothing to launch
        self.decode = decode  #: decode-shaped: the split-KV decode kernel
        self._incumbent = self._incumbent_train = self.serve = self.serve_train = None
        self.serving = False
        self.incumbent = incumbent
        self.incumbent_train = incumbent_train
        self.scale = 1.0  #: the default softmax scale ``1/sqrt(D)`` (set by :func:`_new_call`)
        self.cfg: Optional[KernelConfig] = None
        self.bwd_cfg = None
        self.kv_layout: Optional[tuple] = None  #: (k's strides, v's, v's shape, dk's strides, dv's) of the last backward


    @property
    def incumbent(self) -> Optional[str]:
        """The SDPA backend the entry says won the forward (None: rocmflash's kernel); a decode-shaped call's from
        its decode- entry (:func:`decode_incumbent`), timed eagerly with host time. ``ROCMFLASH_NO_INCUMBENT`` is
        read per call. Setting it (or :attr:`incumbent_train`) also sets :attr:`serve` (:attr:`serve_train`): the
        backend as a ready call ``(q, k, v, scale or None) -> out`` (:func:`sdpa_server`) that the public API's
        repeat calls run directly, and :attr:`serving` (either is set: the one test a Triton-served call pays)."""
        return self._incumbent

    @incumbent.setter
    def incumbent(self, backend: Optional[str]) -> None:
        self._serve_side("", backend)

    @property
    def incumbent_train(self) -> Optional[str]:
        """... and the forward+backward's (:attr:`incumbent`)."""
        return self._incumbent_train

    @incumbent_train.setter
    def incumbent_train(self, backend: Optional[str]) -> None:
        self._serve_side("_train", backend)

    def served(self, grad: bool, deterministic: bool = False):
        """The ready SDPA call to run instead of rocmflash's kernels (:attr:`serve`, or :attr:`serve_train` when
        ``grad``), or None: the entry keeps rocmflash's kernel, ``ROCMFLASH_NO_INCUMBENT`` forbids SDPA, or a
        gradient is wanted deterministically (``deterministic``, flash-attn's flag, or torch's deterministic mode:
        SDPA's flash backward adds dQ with atomics; rocmflash's backward has none)."""
        if grad:
            if deterministic or torch.are_deterministic_algorithms_enabled():
                return None
            serve = self.serve_train
        else:
            serve = self.serve
        if serve is None or incumbent_disabled():
            return None
        return serve

    def pin(self, backend: Optional[str]) -> None:
        """Serve ``backend`` on both sides (None: rocmflash's kernels) exactly: no first-call fallback, a refusal
        raises. For the tune's timing routes (:mod:`rocmflash.tuning.incumbent_worker`), which must time what they
        name or fail; a repeat call with the same backend changes nothing."""
        if self.pinned and backend == self._incumbent and backend == self._incumbent_train:
            return
        self.pinned = True
        serve = sdpa_server(backend, self.sdpa_causal, self.gqa)
        self._incumbent = self._incumbent_train = backend
        self.serve = self.serve_train = serve
        self.serving = serve is not None

    def settle(self, side: str, backend: Optional[str]) -> None:
        """Serve ``backend`` on ``side`` ("" forward, "_train") unguarded (None: rocmflash's kernels): what the
        first-use timing decided (:func:`_first_use_call`), which ran that backend on this problem."""
        setattr(self, "_incumbent" + side, backend)
        setattr(self, "serve" + side, sdpa_server(backend, self.sdpa_causal, self.gqa))
        self.serving = self.serve is not None or self.serve_train is not None

    def await_first_use(self, side: str, decide) -> None:
        """Have ``side``'s next served call be ``decide`` (:func:`_first_use_call`), which times both sides once
        and settles the side (:meth:`settle`)."""
        setattr(self, "serve" + side, decide)
        self.serving = True

    def _serve_side(self, side: str, backend: Optional[str]) -> None:
        """Set ``_incumbent{side}`` and its ready call ``serve{side}`` (``side``: "" forward, "_train"), the first
        call guarded unless :meth:`pin` set it."""
        if backend != getattr(self, "_incumbent" + side):
            setattr(self, "_incumbent" + side, backend)
            serve = sdpa_server(backend, self.sdpa_causal, self.gqa)
            if serve is not None and not self.pinned:
                serve = self._first_call_guarded(side, backend, serve)
            setattr(self, "serve" + side, serve)
            self.serving = self.serve is not None or self.serve_train is not None

    def _first_call_guarded(self, side: str, backend: str, sdpa):
        """``sdpa`` (a ready call) whose first call falls back to rocmflash's kernels where SDPA refuses it
        (:func:`rocmflash.api.incumbent.first_call`): that side of the plan then serves rocmflash for good;
        where it ran, the plan's ``serve{side}`` becomes ``sdpa`` itself (later calls pay nothing for the guard)."""
        train = side == "_train"

        def first_sdpa_call(q, k, v, scale):
            out = first_call(sdpa, backend, train, self.problem, q, k, v, scale)
            if out is None:  # refused: this side is rocmflash's from now on
                if getattr(self, "_incumbent" + side) == backend:
                    setattr(self, "incumbent" + side, None)
                return attention_forward(q, k, v, self.causal, self.scale if scale is None else scale, "online",
                                         None, False, self)[0]
            if getattr(self, "serve" + side) is first_sdpa_call:
                setattr(self, "serve" + side, sdpa)
            return out
        return first_sdpa_call


_CALLS: dict = {}  #: :func:`_call_plan`'s key -> _Call; cleared with the selection caches (register_clear)
_MAX_CALLS = 4096
register_clear(_CALLS.clear)
register_clear(first_use.forget)  # decisions in memory (their files are read again)


def _layout_strides(shape, bshd: bool) -> tuple:
    """Strides of a new contiguous ``(B, H, S, D)`` tensor, or of a ``(B, S, H, D)`` one viewed as
    ``(B, H, S, D)`` (``bshd``): torch's rule, a size-0 extent counting as 1."""
    _, H, S, D = shape
    inner = (S, H) if bshd else (H, S)
    s3 = 1
    s2 = max(D, 1)
    s1 = s2 * max(inner[1], 1)
    s0 = s1 * max(inner[0], 1)
    return (s0, s2, s1, s3) if bshd else (s0, s1, s2, s3)


def _is_bshd(t) -> bool:
    """Whether ``empty_like_layout(t)`` is ``(B, S, H, D)`` in memory: ``t`` is a transposed contiguous one.
    From sizes and strides (torch's contiguity rule), so a plan is made without a tensor op."""
    shape, stride = tuple(t.shape), t.stride()
    if len(shape) != 4 or _contiguous(shape, stride):
        return False
    swap = (0, 2, 1, 3)
    return _contiguous(tuple(shape[i] for i in swap), tuple(stride[i] for i in swap))


def _contiguous(shape: tuple, stride: tuple) -> bool:
    """``Tensor.is_contiguous()`` of these sizes and strides: size-1 extents' strides do not matter, nor
    does anything of an empty tensor."""
    if 0 in shape:
        return True
    expected = 1
    for size, step in zip(reversed(shape), reversed(stride)):
        if size != 1:
            if step != expected:
                return False
            expected *= size
    return True


def _call_plan(q, k, causal: bool) -> _Call:
    """The :class:`_Call` of a default call: one dict lookup keyed by what decides it (q's shape and strides,
    k's shape, dtype, device, causal flag and, for CPU tensors, the interpreter switch)."""
    # the interpreter switch only where it can change a selection: CPU tensors are served the live GPU's
    # entries under TRITON_INTERPRET=1 only; a GPU tensor's selection never depends on it (no env read)
    key = (q.shape, q.stride(), k.shape, q.dtype, q.device, causal, q.is_cuda or L.interpreting())
    call = _CALLS.get(key)
    return call if call is not None else _new_call(key, q, k, causal)


def _new_call(key: tuple, q, k, causal: bool) -> _Call:
    """Decide a new signature (allocation strides, empty, decode-shaped, the entry's incumbent) and keep it."""
    B, Hq, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    empty = B * Hq * Sq * D == 0 or Sk == 0
    group = 0 if empty else Hq // Hkv
    decode = not empty and is_decode_shaped(Sq, Sk, group)
    fwd = train = None
    problem = () if empty else refusal_problem(q, k, sdpa_causal(causal, Sq))
    sdpa_applies = not empty and shape_excludes(causal, Sq, Sk, group) is None
    if sdpa_applies:
        if decode:  # the decode entry's eager timing decides; forward only (no training timing for decode)
            fwd = decode_incumbent(q.device, D, q.dtype, group, Sk, B)
        else:  # the entry's kernel times scaled to this call, against the eager host floors (host-bound calls)
            fwd, train = call_incumbents(q.device, D, q.dtype, causal, group, B, Hq, Sq, Sk)
        # a backend that refused this problem's first call here before: rocmflash's kernels (no second try)
        fwd = None if fwd is not None and fell_back(fwd, False, problem) else fwd
        train = None if train is not None and fell_back(train, True, problem) else train
    call = _Call(q.device, _layout_strides(q.shape, _is_bshd(q)), (B, Hq, Sq), empty, decode, Hq != Hkv, fwd, train,
                 sdpa_causal(causal, Sq), bool(causal), problem)
    if sdpa_applies and first_use.enabled() and first_use.on_live_gpu(q) and _selection.overridden("forward") is None:
        if decode:  # forward only: a decode-shaped call that needs gradients has no SDPA side (as before)
            untimed = [not decode_timed(q.device, D, q.dtype, group, Sk, B), False]
        else:
            untimed = [not timed for timed in timed_sides(q.device, D, q.dtype, causal, group, Sk)]
        if any(untimed):
            _arm_first_use(call, q, k, untimed)
    if D > 0:
        call.scale = 1.0 / math.sqrt(D)  # what the API computes for softmax_scale=None
    if len(_CALLS) >= _MAX_CALLS:  # a new shape every call (a growing cache): start over, never grow unbounded
        _CALLS.clear()
    _CALLS[key] = call
    return call


def _arm_first_use(call: _Call, q, k, untimed: list) -> None:
    """For each side no measured entry decides (``untimed``: forward, forward+backward), the decision recorded at
    a first use before (:mod:`rocmflash.api.first_use`), else a first call that times both sides."""
    gpu, _ = _selection.device_identity(q.device)
    env = first_use.environment(q.device)
    B, Hq, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    shape = {"batch": B, "heads_q": Hq, "heads_kv": Hkv, "seqlen_q": Sq, "seqlen_k": Sk, "head_dim": D}
    for side, train in (("", False), ("_train", True)):
        if not untimed[train]:
            continue
        key = first_use.decision_key(D, q.dtype, call.causal, Hq // Hkv, B, Hq, Sq, Sk, train)
        rec = first_use.recorded(gpu, key, env)
        if rec is not None:
            call.settle(side, DEFAULT if rec["served_by"] == "sdpa" else None)
        else:
            call.await_first_use(side, _first_use_call(call, side, gpu, key, env, shape))


def _first_use_call(call: _Call, side: str, gpu, key: str, env: dict, shape: dict):
    """The served call of an undecided side: times rocmflash's call against SDPA's on this call's tensors
    (:func:`rocmflash.api.first_use.decide`, unless another plan of the problem decided it meanwhile), settles the
    side, and runs the winner. While a graph captures, or on traced/mode-wrapped tensors, SDPA serves the call and
    nothing is timed or recorded."""
    train = side == "_train"
    sdpa = sdpa_server(DEFAULT, call.sdpa_causal, call.gqa)

    def first_use_call(q, k, v, scale):
        if first_use.capturing(q) or _needs_dispatcher(q, k, v):
            return sdpa(q, k, v, scale)
        run_scale = call.scale if scale is None else float(scale)
        rec = first_use.recorded(gpu, key, env)
        if rec is None:
            steps = first_use.side_steps(lambda q, k, v, s, grad: _rocmflash_call(call, q, k, v, run_scale, grad),
                                         sdpa, q, k, v, scale, train)
            try:
                with torch.cuda.device(q.device) if q.is_cuda else contextlib.nullcontext():  # its stream's events
                    rec = first_use.decide(gpu, key, env, steps, shape)
            except torch.OutOfMemoryError:  # the timing's own buffers did not fit: SDPA serves, nothing recorded
                torch.cuda.empty_cache()
                first_use.out_of_memory(key)
                rec = {"served_by": "sdpa"}
        backend = DEFAULT if rec["served_by"] == "sdpa" else None
        call.settle(side, backend)
        return sdpa(q, k, v, scale) if backend else _rocmflash_call(call, q, k, v, run_scale, train)
    return first_use_call


def _rocmflash_call(call: _Call, q, k, v, scale: float, grad: bool):
    """rocmflash's output of a default call by its plan (differentiable with ``grad``), bypassing the served side."""
    if grad:
        return _EagerAttention.apply(q, k, v, call.causal, scale, "online", None, call)[0]
    return _forward_impl(q, k, v, call.causal, scale, "online", None, False, call)[0]


_DECODE_INCUMBENT: dict = {}  #: (device, problem, KV and batch buckets) -> (the decode entry's SDPA backend or None,
#: whether an entry's timing decided it)
register_clear(_DECODE_INCUMBENT.clear)


def decode_incumbent(device, head_dim: int, dtype, group: int, seqlen_k: int, batch: int) -> Optional[str]:
    """The SDPA backend a dense decode-shaped call runs instead of the decode kernel, or None: the ``decode-`` entry
    of its KV-length and batch buckets (:func:`rocmflash.api.incumbent.decode_timing`) timed it faster, eager
    per call with host time (``rocmflash db refresh-incumbents --decode``), or SDPA's time is too short for the kernel's
    route to stay ahead on a slower host (:func:`rocmflash.api.incumbent.decode_winner`). Before the
    ``ROCMFLASH_NO_INCUMBENT`` switch (read per call by the caller). Cached per bucket: a cache one key longer each
    step costs one dict lookup, no database read, no host-device sync."""
    return _decode_decision(device, head_dim, dtype, group, seqlen_k, batch)[0]


def decode_timed(device, head_dim: int, dtype, group: int, seqlen_k: int, batch: int) -> bool:
    """Whether a ``decode-`` entry's timing decides this decode-shaped call (:func:`decode_incumbent`); where none
    does, its first use times the decode kernel against SDPA (:mod:`rocmflash.api.first_use`)."""
    return _decode_decision(device, head_dim, dtype, group, seqlen_k, batch)[1]


def _decode_decision(device, head_dim: int, dtype, group: int, seqlen_k: int, batch: int) -> tuple:
    key = (getattr(device, "type", str(device)), getattr(device, "index", None), L.interpreting(), int(head_dim),
           dtype, int(group), int(seqlen_k - 1).bit_length(), int(batch - 1).bit_length())
    try:
        return _DECODE_INCUMBENT[key]
    except KeyError:
        pass
    gpu_name, _ = _selection.device_identity(device)
    try:
        _, field, why_not = decode_timing(gpu_name, head_dim, dtype, group, seqlen_k, batch)
        floor = None if why_not else decode_host_floor(gpu_name, head_dim, dtype)
    except Exception:  # a broken database must not break attention: the decode kernel
        field, why_not, floor = None, "unreadable database", None
    decision = _DECODE_INCUMBENT[key] = (None if why_not else decode_winner(field, floor)[0], not why_not)
    return decision


def _call_cfg(call: _Call, q, k, causal: bool) -> tuple:
    """``(the call's forward config, its entry's undecided build check or None)``: :func:`select_config` on its
    first launch, then kept in the plan -- once the entry's first-use build check
    (:mod:`rocmflash.api.build_check`) has decided: until then the plan keeps none, so each call launches what
    the check serves now (:func:`_launch_checked`)."""
    cfg, check = _selected(q, k, causal, "online")
    if check is None:
        call.cfg = cfg
    return cfg, check


def _selected(q, k, causal: bool, variant: str) -> tuple:
    """``(config, undecided build check or None)`` of a forward without a config (:func:`select_config`)."""
    args = (q.device, q.shape[3], q.dtype, causal, q.shape[1] // k.shape[1])
    cfg = select_config(*args, q.shape[2], k.shape[2], variant)
    return cfg, _selection.pending_check(*args, k.shape[2], variant)


def _launch_checked(check, call: Optional[_Call], q, k, v, causal: bool, scale: float, variant: str, out, lse):
    """A forward launch of what ``check`` serves, whose first compile it judges (:mod:`rocmflash.api.build_check`):
    the launch's compiled kernel is read (Triton compiled it anyway); a config that no longer holds is replaced for
    the next call (this call's result is right either way), and one that fails to build is replaced at once, this
    call launching the next candidate. Once decided, ``call`` (the plan, if any) keeps the decided config."""
    from rocmflash.api import build_check

    while True:
        cfg = check.config()
        try:
            with L.watch_compiles() as seen, L.on_device(q):
                get_variant(variant).launch(q, k, v, cfg, bool(causal), float(scale), out=out, lse=lse)
        except Exception as err:  # a build that fails: the next candidate serves this call; anything else raises
            if check.final or not build_check.is_build_failure(err):
                raise
            check.observe(build_check.failed_profile(err))
            if check.exhausted:
                raise
            continue
        build_check.observe_launch(check, seen, cfg)
        break
    if call is not None and check.final:
        call.cfg = check.config()


def _alloc(call: _Call, q, need_lse: bool):
    """``(out, lse or None)`` of a default call: ``empty_like_layout(q)`` and the fp32 LSE, by their strides."""
    out = torch.empty_strided(q.shape, call.out_stride, dtype=q.dtype, device=call.device)
    if not need_lse:
        return out, None
    return out, torch.empty_strided(call.lse_shape, call.lse_stride, dtype=torch.float32, device=call.device)


# ----------------------------------------------------------------------------- implementations
@functools.lru_cache(maxsize=1024)
def _config_from_json(config: str) -> KernelConfig:
    return KernelConfig.from_json(config)


def _forward_impl(q, k, v, causal: bool, scale: float, variant: str, cfg: Optional[KernelConfig],
                  need_lse: bool = True, call: Optional[_Call] = None, sinks: Optional[torch.Tensor] = None):
    """Allocate, select a config if none is given, launch; ``(out, lse or None)``.

    A default call (online variant, no config) runs from its :class:`_Call` (``call``, or looked up here);
    any other allocates and launches as asked. ``sinks`` (fp32 ``(Hq,)``, online only): never a plan's call,
    whose decode kernel has no sinks -- the online kernel with the selected config."""
    if sinks is not None:
        call = None
        if variant != "online":
            raise ValueError(sinks_variant_error(variant))
    if cfg is None and variant == "online" and sinks is None:
        if call is None:
            call = _call_plan(q, k, causal)
        out, lse = _alloc(call, q, need_lse)
        empty = call.empty
    else:
        out = _fresh_out(q)
        lse = _lse_empty(q) if need_lse else None
        empty = out.numel() == 0 or k.shape[2] == 0
    if empty:  # nothing to launch: no rows, or no keys to attend
        out.zero_()
        if lse is not None and sinks is not None:  # a row that sees no key sees its head's sink only
            lse.copy_(sinks.view(1, -1, 1).expand_as(lse))
        elif lse is not None:
            lse.fill_(float("-inf"))
        return out, lse
    if scale <= 0:  # legal but odd: the forward kernels need a positive scale (rocmflash/api/scale.py); the
        q, scale = fold_scale_sign(q, scale)  # backward recomputes exp(scale * q·k - lse), exact for any sign
    if call is not None:
        if call.decode:
            # a few query tokens over a long key set: the split-KV decode kernel, on (B, S, H, D) views
            attend_whole_cache(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale, causal,
                               out.transpose(1, 2), lse, call)
            return out, lse
        cfg = call.cfg
        if cfg is None:  # the signature's first launch (or its entry's build check is undecided)
            cfg, check = _call_cfg(call, q, k, causal)
            if check is not None:
                _launch_checked(check, call, q, k, v, causal, scale, "online", out, lse)
                return out, lse
    elif cfg is None:  # another variant, no config: that variant's selection
        cfg, check = _selected(q, k, causal, variant)
        if check is not None and sinks is None:
            _launch_checked(check, None, q, k, v, causal, scale, variant, out, lse)
            return out, lse
    switch = L.on_device(q)
    if sinks is not None:  # (only the online kernel takes them: checked above)
        with switch:
            get_variant(variant).launch(q, k, v, cfg, bool(causal), float(scale), out=out, lse=lse, sinks=sinks)
    elif switch is L.NO_SWITCH:  # the common case: no context manager to enter and leave
        get_variant(variant).launch(q, k, v, cfg, bool(causal), float(scale), out=out, lse=lse)
    else:
        with switch:
            get_variant(variant).launch(q, k, v, cfg, bool(causal), float(scale), out=out, lse=lse)
    return out, lse


def sinks_variant_error(variant: str) -> str:
    """The one-line refusal of attention sinks with a forward variant other than ``online``."""
    return (f"sinks: variant={variant!r} has no attention-sink support; only variant='online' takes sinks "
            "(pass variant='online')")


def _backward_impl(dout, q, k, v, out, lse, dlse, causal: bool, scale: float, call: Optional[_Call] = None,
                   sinks: Optional[torch.Tensor] = None):
    """dq, dk, dv by the Triton backward; ``call``: the forward's plan, which keeps the backward config and
    allocates the gradients (``empty_like_layout``'s layouts, by their strides). With ``sinks`` (a call with
    sinks has no plan): ``(dq, dk, dv, dsinks)``."""
    if call is None:
        cfg = select_bwd_config(q.device, q.shape[3], q.dtype, causal, q.shape[1] // k.shape[1], k.shape[2])
        with _device_ctx(q):
            return backward(dout, q, k, v, out, lse, bool(causal), float(scale), dlse=dlse, config=cfg, sinks=sinks)
    cfg = call.bwd_cfg
    if cfg is None:
        cfg = call.bwd_cfg = select_bwd_config(q.device, q.shape[3], q.dtype, causal, q.shape[1] // k.shape[1],
                                               k.shape[2])
    dq, dk, dv = _grad_buffers(call, q, k, v)
    switch = L.on_device(q)
    if switch is L.NO_SWITCH:
        return backward(dout, q, k, v, out, lse, bool(causal), float(scale), dlse=dlse, config=cfg, dq=dq, dk=dk,
                        dv=dv)
    with switch:
        return backward(dout, q, k, v, out, lse, bool(causal), float(scale), dlse=dlse, config=cfg, dq=dq, dk=dk,
                        dv=dv)


def _grad_buffers(call: _Call, q, k, v) -> tuple:
    """New dq, dk, dv laid out as ``empty_like_layout`` lays them out; k's and v's layouts are kept in the
    plan (its key holds q's strides but not theirs) and recomputed when their strides change."""
    device = call.device
    dq = torch.empty_strided(q.shape, call.out_stride, dtype=q.dtype, device=device)
    ks, vs, v_shape = k.stride(), v.stride(), v.shape
    kv = call.kv_layout
    if kv is None or kv[0] != ks or kv[1] != vs or kv[2] != v_shape:
        kv = call.kv_layout = (ks, vs, v_shape, _layout_strides(k.shape, _is_bshd(k)),
                               _layout_strides(v_shape, _is_bshd(v)))
    return (dq, torch.empty_strided(k.shape, kv[3], dtype=k.dtype, device=device),
            torch.empty_strided(v_shape, kv[4], dtype=v.dtype, device=device))


# ----------------------------------------------------------------------------- forward op
@torch.library.custom_op("rocmflash::attn_fwd", mutates_args=())
def attn_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
             variant: str, config: str, sinks: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    return _forward_impl(q, k, v, causal, scale, variant, _config_from_json(config) if config else None,
                         sinks=sinks)


@attn_fwd.register_fake
def _attn_fwd_fake(q, k, v, causal, scale, variant, config, sinks=None):
    return _fresh_out(q), _lse_empty(q)


# ----------------------------------------------------------------------------- backward op
@torch.library.custom_op("rocmflash::attn_bwd", mutates_args=())
def attn_bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
             lse: torch.Tensor, dlse: Optional[torch.Tensor], causal: bool,
             scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _backward_impl(dout, q, k, v, out, lse, dlse, causal, scale)


@attn_bwd.register_fake
def _attn_bwd_fake(dout, q, k, v, out, lse, dlse, causal, scale):
    return empty_like_layout(q), empty_like_layout(k), empty_like_layout(v)


@torch.library.custom_op("rocmflash::attn_bwd_sinks", mutates_args=())
def attn_bwd_sinks(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                   lse: torch.Tensor, dlse: Optional[torch.Tensor], sinks: torch.Tensor, causal: bool,
                   scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _backward_impl(dout, q, k, v, out, lse, dlse, causal, scale, sinks=sinks)


@attn_bwd_sinks.register_fake
def _attn_bwd_sinks_fake(dout, q, k, v, out, lse, dlse, sinks, causal, scale):
    return empty_like_layout(q), empty_like_layout(k), empty_like_layout(v), torch.empty_like(sinks)


# ----------------------------------------------------------------------------- autograd
def _setup_context(ctx, inputs, output):
    q, k, v, causal, scale, variant, config, sinks = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, *((sinks,) if sinks is not None else ()))
    ctx.causal = causal
    ctx.scale = scale  # lse stays differentiable: its gradient enters the backward as dlse


def _input_grads(ctx, dout, dlse, backward_fn):
    """dq, dk, dv (and None for the non-tensor inputs) from the saved forward, by ``backward_fn``; with sinks
    the sinks' gradient too, by ``attn_bwd_sinks``."""
    q, k, v, out, lse, *sinks = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(out)
    if sinks:
        dq, dk, dv, dsinks = torch.ops.rocmflash.attn_bwd_sinks(dout, q, k, v, out, lse, dlse, sinks[0], ctx.causal,
                                                                ctx.scale)
        return dq, dk, dv, None, None, None, None, dsinks
    dq, dk, dv = backward_fn(dout, q, k, v, out, lse, dlse, ctx.causal, ctx.scale)
    return dq, dk, dv, None, None, None, None, None


def _backward(ctx, dout, dlse):
    return _input_grads(ctx, dout, dlse, attn_bwd)  # the op: what torch.compile's AOTAutograd traces


attn_fwd.register_autograd(_backward, setup_context=_setup_context)


# ----------------------------------------------------------------------------- eager fast path
class _EagerAttention(torch.autograd.Function):
    """The op's autograd formula without the dispatcher, for plain tensors in eager mode. ``call``: the
    default call's :class:`_Call` (None with a config or another variant), kept for the backward."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, variant, cfg, call=None, sinks=None):
        out, lse = _forward_impl(q, k, v, causal, scale, variant, cfg, True, call, sinks)
        ctx.save_for_backward(q, k, v, out, lse, *((sinks,) if sinks is not None else ()))
        ctx.causal, ctx.scale, ctx.call = causal, scale, call
        ctx.set_materialize_grads(False)  # an unused LSE gives dlse=None, not a tensor of zeros
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, *sinks = ctx.saved_tensors
        if dout is None:
            dout = torch.zeros_like(out)
        if sinks:  # (a call with sinks has no plan: ctx.call is None)
            dq, dk, dv, dsinks = _backward_impl(dout, q, k, v, out, lse, dlse, ctx.causal, ctx.scale, None, sinks[0])
            return dq, dk, dv, None, None, None, None, None, dsinks
        dq, dk, dv = _backward_impl(dout, q, k, v, out, lse, dlse, ctx.causal, ctx.scale, ctx.call)
        return dq, dk, dv, None, None, None, None, None, None


def _needs_dispatcher(q, k, v) -> bool:
    """Whether this call must go through the torch op: tracing, tensor subclasses, modes, functorch.

    Everything else (plain tensors in eager mode, the common case) skips the dispatcher,
    which costs more host time per call than rocmflash's own launch path.
    """
    if torch.compiler.is_compiling() or not (type(q) is torch.Tensor and type(k) is torch.Tensor
                                             and type(v) is torch.Tensor):
        return True
    if torch._C._is_torch_function_mode_enabled() or torch._C._are_functorch_transforms_active():
        return True
    return torch._C._len_torch_dispatch_stack() > 0  # _get_current_dispatch_mode() is not None, without a call


def attention_forward(q, k, v, causal: bool, scale: float, variant: str = "online",
                      config: Optional[KernelConfig] = None, need_lse: bool = True, call: Optional[_Call] = None,
                      deterministic: bool = False, sinks: Optional[torch.Tensor] = None):
    """``(out, lse)`` of validated tensors, differentiable; ``lse`` is None when not needed and no grad flows.

    A default call (online variant, no config) whose database entry says the platform's SDPA won
    (:mod:`rocmflash.api.incumbent`) runs SDPA -- not while torch.compile traces (the op keeps the graph whole),
    not when the LSE is wanted (so never for ``torch.ops.rocmflash.attn_fwd``, which returns it), never where SDPA
    computes another function (causal with ``Sq != Sk`` and more than one query). A decode-shaped call is decided
    by its ``decode-`` entry (:func:`decode_incumbent`: eager times, host included; forward only: a call that
    needs gradients runs the decode kernel and the Triton backward). Otherwise plain eager calls run the
    implementation directly (an autograd Function when a gradient is needed); traced, subclassed or
    mode-wrapped calls go through ``torch.ops.rocmflash.attn_fwd``. ``call``: the default call's plan
    (:func:`_call_plan` of these tensors and ``causal``) when the caller kept it, else looked up here.
    A call that needs gradients under ``deterministic`` (flash-attn's flag) or
    ``torch.use_deterministic_algorithms(True)`` never runs SDPA (:meth:`_Call.served`).
    ``sinks``: checked fp32 ``(Hq,)`` attention-sink logits (differentiable), or None. SDPA has no sinks, nor
    has the decode kernel: a call with sinks runs the online kernel (no plan), its gradient included.
    """
    if sinks is not None:
        return _forward_with_sinks(q, k, v, causal, scale, variant, config, need_lse, sinks)
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if config is None and variant == "online" and not torch.compiler.is_compiling():
        if call is None:
            call = _call_plan(q, k, causal)
        serve = None if need_lse else call.served(grad, deterministic)
        if serve is not None:
            return serve(q, k, v, float(scale)), None
    else:
        call = None
    if _needs_dispatcher(q, k, v):
        return torch.ops.rocmflash.attn_fwd(q, k, v, bool(causal), float(scale), variant,
                                            config.to_json() if config is not None else "")
    if grad:
        return _EagerAttention.apply(q, k, v, bool(causal), float(scale), variant, config, call)
    return _forward_impl(q, k, v, bool(causal), float(scale), variant, config, need_lse, call)


def _forward_with_sinks(q, k, v, causal: bool, scale: float, variant: str, config: Optional[KernelConfig],
                        need_lse: bool, sinks: torch.Tensor):
    """:func:`attention_forward` of a call with attention sinks: the op when tracing (its ``sinks`` argument),
    the autograd Function when a gradient is wanted (of q, k, v or the sinks), else the implementation."""
    if variant != "online":  # (before anything is allocated or traced)
        raise ValueError(sinks_variant_error(variant))
    if _needs_dispatcher(q, k, v) or type(sinks) is not torch.Tensor:
        return torch.ops.rocmflash.attn_fwd(q, k, v, bool(causal), float(scale), variant,
                                            config.to_json() if config is not None else "", sinks)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad or sinks.requires_grad):
        return _EagerAttention.apply(q, k, v, bool(causal), float(scale), variant, config, None, sinks)
    return _forward_impl(q, k, v, bool(causal), float(scale), variant, config, need_lse, None, sinks)


# ----------------------------------------------------------------------------- entry point
def attention_op(q, k, v, causal: bool = False, scale: Optional[float] = None, variant: str = "online",
                 config: Optional[KernelConfig] = None, need_lse: bool = True, sinks: Optional[torch.Tensor] = None):
    """``(out, lse)`` (differentiable; no input validation here); see :func:`attention_forward`. ``sinks``: the
    caller checks them (:func:`rocmflash.api.sinks.check_sinks` gives the fp32 tensor this takes)."""
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    return attention_forward(q, k, v, causal, scale, variant, config, need_lse, sinks=sinks)


__all__ = ["attn_fwd", "attn_bwd", "attn_bwd_sinks", "attention_op", "attention_forward"]

# the varlen and decode entry points' ops (rocmflash::varlen_fwd/_bwd, kvcache_fwd/_append_fwd): this module is the
# one ``torch.ops.rocmflash`` imports on first use (rocmflash._OP_MODULES); last, as they import the API modules
from rocmflash.api import decode_ops, varlen_ops  # noqa: E402,F401
