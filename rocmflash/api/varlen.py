"""``flash_attn_varlen_func``: packed (variable-length) attention, flash-attn's argument conventions.

Packed training and the prefill of many prompts hand attention one ``(total, H, D)``
tensor per operand plus cumulative sequence lengths instead of a padded batch: no padding
is stored or computed. Code written for flash-attn switches by changing the import::

    from rocmflash import flash_attn_varlen_func
    out = flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                 causal=True)

Forward and backward (autograd), GQA/MQA, bottom-right causal per sequence, sliding
windows ``(left, right)``, tanh soft-capping, head dims 16..256, zero-length sequences.
Bad input raises ``ValueError``/``TypeError`` naming the argument before any kernel runs.
The *values* of ``cu_seqlens`` are checked by the kernels, not on the host (a host read
waits for the GPU): wrong ones are clamped into the packed tensors and reported by
:func:`check_errors` or a later call (see :func:`flash_attn_varlen_func`);
``check_values=True`` checks them on the host first.
"""

from __future__ import annotations

import math
from typing import Optional

from rocmflash.hw.compat import require_supported_versions

require_supported_versions()

import torch  # noqa: E402

from rocmflash.kernels import error_words as EW  # noqa: E402
from rocmflash.kernels import masks as M  # noqa: E402
from rocmflash.kernels.varlen import host as VK  # noqa: E402
from rocmflash.kernels.varlen import checks as VC  # noqa: E402
from rocmflash.kernels import launch as L  # noqa: E402
from rocmflash.kernels.launch import check_device  # noqa: E402
from rocmflash.api.scale import check_softmax_scale  # noqa: E402
from rocmflash.api.sinks import check_sinks  # noqa: E402
from rocmflash.api.varlen_paged import BAD_PAGE, BAD_PAGE_TEXT  # noqa: E402
from rocmflash.api import varlen_incumbent as VI  # noqa: E402

_DTYPES = (torch.float16, torch.bfloat16)
#: what a ``max_seqlen`` may be: a torch.SymInt is a Python int torch.compile traces as a dynamic size (a new
#: ``max_seqlen`` every batch would otherwise recompile)
_INTS = (int, torch.SymInt)
_capturing = EW.capturing  #: whether a CUDA graph is being captured on the device (no host read, no copy then)


# ----------------------------------------------------------------------------- validation
def _check_tensor(name: str, t, ndim: int, layout: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D {layout}, got shape {tuple(t.shape)}")


def check_qkv(q, k, v, layout_q: str = "(total_q, Hq, D)", layout_kv: str = "(total_k, Hkv, D)") -> None:
    """Types, ranks, dtypes, devices, head dim (16..256) and the GQA ratio of packed q/k/v."""
    _check_tensor("q", q, 3, layout_q)
    _check_tensor("k", k, 3, layout_kv)
    _check_tensor("v", v, 3, layout_kv)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype not in _DTYPES:
            raise TypeError(f"{name}.dtype must be torch.float16 or torch.bfloat16, got {t.dtype}")
        if t.dtype != q.dtype:
            raise TypeError(f"{name}.dtype ({t.dtype}) must match q.dtype ({q.dtype})")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}; all must share a device")
    check_device("q", q)
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got k {tuple(k.shape)} and v {tuple(v.shape)}")
    D = q.shape[2]
    if k.shape[2] != D:
        raise ValueError(f"q, k and v must share the head dim: q has {D}, k/v have {k.shape[2]}")
    if not 16 <= D <= 256:
        raise ValueError(f"head dim must be in 16..256, got {D}")
    Hq, Hkv = q.shape[1], k.shape[1]
    if Hkv < 1 or Hq % Hkv:
        raise ValueError(f"number of query heads ({Hq}) must be a multiple of key/value heads ({Hkv})")


def check_options(softmax_scale, causal, window_size, softcap) -> tuple[int, int]:
    """Validate the scalar options; returns the band ``(left, right)`` for the kernels."""
    check_softmax_scale(softmax_scale)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        raise ValueError(f"window_size must be a pair (left, right) of ints >= -1, got {window_size!r}")
    for side, w in zip(("left", "right"), window_size):
        if isinstance(w, bool) or not isinstance(w, int):
            raise TypeError(f"window_size {side} must be an int, got {type(w).__name__}")
        if w < -1:
            raise ValueError(f"window_size {side} must be >= -1 (-1 = unbounded), got {w}")
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)):
        raise TypeError(f"softcap must be a float, got {type(softcap).__name__}")
    if not 0 <= softcap < math.inf:  # (not math.isfinite: torch.compile(dynamic=True) cannot trace it on a float)
        raise ValueError(f"softcap must be a finite float >= 0 (0 = off), got {softcap}")
    return M.band_offsets(causal, tuple(window_size))


def check_cu_seqlens(name: str, cu, total: int, max_seqlen, device, batch: Optional[int] = None,
                     read_values: bool = True) -> int:
    """Check a cumulative-lengths tensor against its packed operand; returns the batch size.

    Shape and dtype always; values (starts at 0, non-decreasing, ends at ``total``, no
    sequence longer than ``max_seqlen``) when ``read_values`` and no graph is being captured.
    """
    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of int32, got {type(cu).__name__}")
    if cu.dtype != torch.int32:
        raise TypeError(f"{name} must have dtype torch.int32, got {cu.dtype}")
    if cu.ndim != 1 or cu.shape[0] < 1:
        raise ValueError(f"{name} must be 1-D (batch + 1,), got shape {tuple(cu.shape)}")
    if cu.device != device:
        raise ValueError(f"{name} is on {cu.device} but q is on {device}; all must share a device")
    if batch is not None and cu.shape[0] != batch + 1:
        raise ValueError(f"{name} has {cu.shape[0]} entries but cu_seqlens_q has {batch + 1}; "
                         "both must be (batch + 1,)")
    mname = name.replace("cu_seqlens", "max_seqlen")
    if isinstance(max_seqlen, bool) or not isinstance(max_seqlen, _INTS) or max_seqlen < 0:
        raise ValueError(f"{mname} must be an int >= 0, got {max_seqlen!r}")
    if not read_values or _capturing(device):
        return cu.shape[0] - 1
    values = cu.tolist()
    if values[0] != 0:
        raise ValueError(f"{name} must start at 0, got {values[0]}")
    if values[-1] != total:
        raise ValueError(f"{name}[-1] ({values[-1]}) must equal the number of packed tokens ({total})")
    lengths = [b - a for a, b in zip(values, values[1:])]
    if any(n < 0 for n in lengths):
        bad = next(i for i, n in enumerate(lengths) if n < 0)
        raise ValueError(f"{name} must be non-decreasing; it drops at index {bad + 1} ({values[bad]} -> {values[bad + 1]})")
    if lengths and max(lengths) > max_seqlen:
        raise ValueError(f"{mname}={max_seqlen} is smaller than the longest sequence in {name} ({max(lengths)})")
    return cu.shape[0] - 1


# ----------------------------------------------------------------------------- device-side value checks
#: a default call starts an asynchronous copy of its device's error word every this many calls
ERROR_POLL_CALLS = 64
_TEXTS = ((VC.BAD_FIRST.value, "cu_seqlens_{s} must start at 0"),
          (VC.BAD_LAST.value, "cu_seqlens_{s}[-1] must equal the number of packed tokens ({s}.shape[0])"),
          (VC.BAD_ORDER.value, "cu_seqlens_{s} must be non-decreasing"),
          (VC.BAD_LONG.value, "a sequence of cu_seqlens_{s} is longer than max_seqlen_{s}"))
#: what the varlen word's bits say: ``cu_seqlens_q``'s bits, then ``cu_seqlens_k``'s (shifted by ``K_SHIFT``)
_REPORT = EW.Report(
    "flash_attn_varlen_func",
    tuple((bit << shift, text.format(s=side)) for side, shift in (("q", 0), ("k", VC.K_SHIFT.value))
          for bit, text in _TEXTS) + ((BAD_PAGE, BAD_PAGE_TEXT),),
    " (clamped into the packed tensors, so no memory outside them was touched, but those sequences' outputs are "
    "wrong); pass check_values=True to have each call checked on the host, with the index and value")
_WATCHES = VC.ERRORS.watches  #: device -> error_words.Watch


def check_errors(device=None) -> None:
    """Raise ``ValueError`` if a ``flash_attn_varlen_func`` call on ``device`` (None: every device used) met
    out-of-range ``cu_seqlens`` values since the last report, and reset the report. Waits for the GPU (reads
    the device-side error word): call it where a step may wait, e.g. once per training step or in tests."""
    for dev in VC.ERRORS.devices(device):
        _read_and_report(dev, "a call since the last check")


def _read_and_report(device, how: str) -> None:
    """Read ``device``'s error word (a wait on a GPU) and, when a bit is set, reset it and raise."""
    VC.ERRORS.read_and_report(device, how, _REPORT)


def _poll_errors(device) -> None:
    """On a GPU, raise what an earlier, finished copy of the error word shows and start a copy every
    :data:`ERROR_POLL_CALLS` calls -- never waiting for the GPU. (On the CPU, under Triton's interpreter,
    :func:`flash_attn_varlen_func` reads the word right after its launch: there is no GPU to wait for.)"""
    VC.ERRORS.poll(device, _REPORT, ERROR_POLL_CALLS, _capturing)


# ----------------------------------------------------------------------------- configs
def _forward_config(device, head_dim: int, dtype, causal: bool, group: int, max_seqlen_k: int, softcap: float,
                    window_left: int):
    """The forward config, cached per problem and bucket: the measured varlen entry of the nearest bucket
    (``rocmflash tune --mode varlen``), else the dense problem's (database entry or per-arch default). On
    AMD the tile becomes the one the varlen kernel needs when a cap or a left window adds registers (the
    tune measured neither)."""
    from rocmflash.api.selection import device_identity, select_varlen_config

    fwd = select_varlen_config(device, head_dim, dtype, causal, group, max(1, max_seqlen_k))
    _, arch = device_identity(device)
    return VK.amd_forward_tile(fwd, arch, head_dim, softcap > 0, window_left < M.UNBOUNDED)


def _backward_config(device, dtype, call: VK.VarlenCall):
    """The backward config, chosen when a backward runs (a forward-only call never reads a backward entry
    nor builds one): :func:`rocmflash.api.selection.select_varlen_bwd_config` -- the measured ``varlen-bwd-``
    entry of the nearest bucket (``rocmflash tune --mode varlen --pass bwd``), else the dense ``bwd-``
    entry, else the per-arch default, each kernel checked to build as the varlen kernel with this call's
    cap and window. Cached per problem, bucket and flags."""
    from rocmflash.api.selection import select_varlen_bwd_config

    return select_varlen_bwd_config(device, call.head_dim, dtype, call.win_right == 0, call.group,
                                    max(1, call.max_seqlen_k), call.softcap > 0, call.win_left < M.UNBOUNDED)


# ----------------------------------------------------------------------------- autograd
class _VarlenAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, call, fwd_cfg, need_lse, sinks=None):
        # rows after the last sequence (call.strict_end False) are never written: zero, not garbage
        out = torch.empty_like(q) if call.strict_end else torch.zeros_like(q)
        needs_grad = any(ctx.needs_input_grad[:3]) or (sinks is not None and ctx.needs_input_grad[8])
        lse = None
        if need_lse or needs_grad:
            if sinks is None:
                lse = torch.empty((q.shape[1], q.shape[0]), dtype=torch.float32, device=q.device)
            else:  # the sinks' gradient sums every row: rows no sequence owns (never written) must add 0
                lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=torch.float32, device=q.device)
        if q.shape[0]:
            with L.on_device(q):
                VK.launch_forward(call, q, k, v, cu_q, cu_k, fwd_cfg, out, lse, sinks)
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, *((sinks,) if sinks is not None else ()))
        ctx.call = call
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, cu_q, cu_k, *sinks = ctx.saved_tensors
        sinks = sinks[0] if sinks else None
        if dout is None:
            dout = torch.zeros_like(out)
        if q.shape[0] == 0 or k.shape[0] == 0:
            dsinks = None if sinks is None else _no_key_sink_grad(sinks, lse, dlse)
            return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v), None, None, None, None, None, dsinks
        bwd_cfg = _backward_config(q.device, q.dtype, ctx.call)
        dlse = dlse.contiguous() if dlse is not None else None
        with L.on_device(q):
            grads = VK.launch_backward(ctx.call, dout, q, k, v, out, lse, dlse, cu_q, cu_k, bwd_cfg, sinks)
        dsinks = grads[3] if sinks is not None else None
        return grads[0], grads[1], grads[2], None, None, None, None, None, dsinks


def _no_key_sink_grad(sinks, lse, dlse):
    """The sinks' gradient of a packed batch without queries or keys: with no key, each row's probabilities are
    its sink's alone (LSE = the sink), so only the LSE's gradient reaches it."""
    if dlse is None or lse is None or lse.numel() == 0:
        return torch.zeros_like(sinks)
    return VK.sink_grad(sinks, lse, -dlse.to(torch.float32))


# ----------------------------------------------------------------------------- public
def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int,
                           dropout_p: float = 0.0, softmax_scale: Optional[float] = None, causal: bool = False,
                           window_size: tuple = (-1, -1), softcap: float = 0.0, alibi_slopes=None,
                           deterministic: bool = False, return_attn_probs: bool = False, block_table=None, *,
                           return_lse: bool = False, check_values: bool = False, s_aux=None):
    """Attention over packed variable-length sequences (flash-attn's ``flash_attn_varlen_func``).

    flash-attn 2.8's signature: its argument order, names and defaults, then rocmflash's keyword-only
    ``return_lse``, ``check_values`` and ``s_aux``.

    Args:
        q: ``(total_q, Hq, D)`` fp16/bf16; sequence ``b`` is rows ``cu_seqlens_q[b]:cu_seqlens_q[b+1]``.
        k, v: ``(total_k, Hkv, D)``; ``Hq % Hkv == 0`` (query head ``h`` uses K/V head ``h // (Hq // Hkv)``).
        cu_seqlens_q, cu_seqlens_k: int32 ``(batch + 1,)``, from 0 to the packed length, non-decreasing
            (zero-length sequences allowed).
        max_seqlen_q, max_seqlen_k: the longest sequence of each (sizes the grid).
        dropout_p: must be 0 (dropout is not implemented).
        softmax_scale: defaults to ``1/sqrt(D)``.
        causal: bottom-right aligned per sequence (query ``i`` sees key ``j <= i + Sk_b - Sq_b``).
        window_size: ``(left, right)`` sliding window, ``-1`` = unbounded on that side; query ``i``
            sees keys ``[i + shift - left, i + shift + right]``; ``causal`` sets ``right = 0``.
        softcap: ``> 0`` caps scores as ``softcap * tanh(scale * q·k / softcap)`` (Gemma 2).
        alibi_slopes: must be None (ALiBi is not implemented: a one-line ``NotImplementedError``).
        deterministic: as in :func:`rocmflash.flash_attn_func`: a call that needs gradients stays on rocmflash's
            kernels (whose backward is deterministic) where the database would serve the platform's varlen
            attention or SDPA (their backward accumulates with atomics).
        return_attn_probs: also return the LSE, flash-attn's way: ``(out, softmax_lse, None)`` (the attention
            matrix is never formed; flash-attn returns it only with dropout).
        block_table: paged prefill: int32 ``(batch, max_pages)``; k and v are then page pools ``(num_blocks,
            page_block_size, Hkv, D)`` and sequence ``b``'s key ``j`` is row ``j % page_block_size`` of page
            ``block_table[b, j // page_block_size]`` (flash-attn 2.8's form; see *Paged prefill* below).
        return_lse: (keyword only, rocmflash's) also return the fp32 natural-log LSE, ``(Hq, total_q)``, as
            ``(out, lse)``.
        s_aux: (keyword only, vLLM's name) attention sinks (gpt-oss): a float ``(Hq,)`` tensor on q's device,
            one logit per query head in the scaled-score domain, joined to every row's softmax denominator
            (``softmax(cat([q·kᵀ * scale, sink_h]))`` without the sink column). Kept in fp32 inside; the LSE
            includes it; differentiable. ``-inf`` = no sink. Always rocmflash's kernel (the platform's varlen
            attention and SDPA have no sinks).

    Returns:
        ``(total_q, Hq, D)`` in q's dtype (rows that see no key are 0 with LSE ``-inf``), ``(out, lse)`` with
        ``return_lse``, or ``(out, lse, None)`` with ``return_attn_probs``. Differentiable in q, k and v (and
        through the LSE).

    **The call never waits for the GPU.** Shapes, dtypes and devices are checked on the host; the
    *values* of ``cu_seqlens_q``/``cu_seqlens_k`` live on the GPU, and reading them would make every
    call wait for it. So the kernels check them instead: a sequence's rows are clamped into the
    packed tensors (no memory outside q, k, v, the output or the gradients is ever read or written;
    that sequence's output is wrong), and an entry list that does not start at 0, does not end at
    the packed length, decreases, or holds a sequence longer than ``max_seqlen_*`` sets a bit of a
    per-device error word. The error reaches you as a ``ValueError`` naming what was wrong: from
    :func:`check_errors` (waits for the GPU; call it where a step may wait, e.g. once per training
    step or in tests), and on its own from a later call on that device -- every call looks at the
    word's last copy without waiting, and a copy is started every :data:`ERROR_POLL_CALLS` calls.
    On the CPU (Triton's interpreter) the call itself raises: there is no GPU to wait for.
    ``check_values=True`` (keyword only, not in flash-attn) checks the values on the host before
    anything runs, as earlier releases did by default: the index and value in the message, at
    the price of two waits per call (skipped while a graph is captured).

    **The platform's varlen attention where it won.** A call (no LSE, window or soft cap; causal only with one
    ``cu_seqlens`` tensor for queries and keys) whose ``rocmflash tune --mode varlen`` entry says torch's
    ``varlen_attn`` was faster runs it (:mod:`rocmflash.api.varlen_incumbent`): by the forward times, or by the
    training steps' when the call needs gradients (not under ``torch.use_deterministic_algorithms(True)``). It runs on
    ``cu_seqlens`` copies made safe on the device by one small launch that also reports wrong values through the
    same error word.

    **Equal lengths run the dense path.** When ``batch * max_seqlen_q == total_q`` and ``batch * max_seqlen_k ==
    total_k`` (sizes alone: no sequence may be longer than its ``max_seqlen``, so every one is exactly that long) a
    plain call (no LSE, window or soft cap) is :func:`rocmflash.flash_attn_func` on ``(batch, S, H, D)`` views of
    q, k and v, with that path's database entry and incumbent; one small launch checks the values by the rules
    above and reports through the same error word. As with ``flash_attn_func``, a backward served by the
    platform's SDPA may accumulate with atomics: set ``torch.use_deterministic_algorithms(True)`` for bitwise
    reproducible gradients.

    **Paged prefill** (``block_table``): k and v are page pools and the pages each sequence uses are gathered
    into a packing first (:mod:`rocmflash.api.varlen_paged`: one copy of the keys the call reads, nothing read
    back); the varlen kernel then runs on it (no dense route or platform kernel).
    """
    if block_table is None:
        check_qkv(q, k, v)
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)):
        raise TypeError(f"dropout_p must be a float, got {type(dropout_p).__name__}")
    if dropout_p != 0.0:
        raise NotImplementedError(f"dropout_p={dropout_p}: rocmflash does not implement attention dropout; "
                                  "use dropout_p=0.0")
    left, right = check_options(softmax_scale, causal, window_size, softcap)
    _check_fa2_options(alibi_slopes, deterministic, return_attn_probs, check_values)
    if return_attn_probs:  # flash-attn's form of the same call: (out, softmax_lse, S_dmask), no S_dmask without dropout
        out, lse = flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, 0.0,
                                          softmax_scale, causal, window_size, softcap, None, deterministic,
                                          block_table=block_table, return_lse=True, check_values=check_values,
                                          s_aux=s_aux)
        return out, lse, None
    sinks = None if s_aux is None else check_sinks(s_aux, q.shape[1], q.device, "s_aux", read_values=check_values)
    if block_table is not None:
        return _paged(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, softcap,
                      (left, right), return_lse, check_values, sinks, block_table)
    if torch.compiler.is_compiling():  # one custom op (rocmflash::varlen_fwd): values, errors, config at run time
        return _traced(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, softcap,
                       (left, right), return_lse, True, check_values, sinks)
    batch = check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.shape[0], max_seqlen_q, q.device,
                             read_values=check_values)
    check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, k.shape[0], max_seqlen_k, q.device, batch,
                     read_values=check_values)
    device = q.device
    if check_values:
        check_errors(device)  # what earlier unchecked calls on this device left (this call waits anyway)
    else:
        _poll_errors(device)
    if sinks is not None:  # neither the dense route's incumbent nor the platform's varlen attention has sinks
        return _run(q, k, v, cu_seqlens_q, cu_seqlens_k, batch, max_seqlen_q, max_seqlen_k, softmax_scale, softcap,
                    (left, right), return_lse, True, device, sinks)
    if not return_lse and softcap == 0.0 and left == M.UNBOUNDED and right in (0, M.UNBOUNDED) \
            and _equal_lengths(batch, q.shape[0], k.shape[0], max_seqlen_q, max_seqlen_k):
        return _as_dense_batch(q, k, v, cu_seqlens_q, cu_seqlens_k, batch, max_seqlen_q, max_seqlen_k, softmax_scale,
                               right == 0, check_values and not _capturing(device), deterministic)
    served = _incumbent_serves(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_k, softmax_scale, softcap, left,
                               right, return_lse, deterministic)
    if served is not None:
        out = VI.run_served(served, q, k, v, cu_seqlens_q, cu_seqlens_k, batch, max_seqlen_q, max_seqlen_k,
                            right == 0, softmax_scale)
        if out is not None:  # (None: torch's function refused this problem's first call; rocmflash's kernel below)
            if device.type != "cuda":  # Triton's interpreter ran the check: reading the word waits for nothing
                _read_and_report(device, "this call")
            return out
    return _run(q, k, v, cu_seqlens_q, cu_seqlens_k, batch, max_seqlen_q, max_seqlen_k, softmax_scale, softcap,
                (left, right), return_lse, True, device)


def _paged(q, k, v, cu_q, cu_k, max_q: int, max_k: int, softmax_scale, softcap, band: tuple, return_lse: bool,
           check_values: bool, sinks, block_table):
    """:func:`flash_attn_varlen_func` with ``block_table``: the pages gathered into a packing with an unused tail
    (:func:`rocmflash.api.varlen_paged.gather_pages`), then the varlen kernel (cu_seqlens' ends not strict)."""
    from rocmflash.api import varlen_paged as VP

    device = q.device
    _check_tensor("q", q, 3, "(total_q, Hq, D)")
    batch = check_cu_seqlens("cu_seqlens_q", cu_q, q.shape[0], max_q, device, read_values=check_values)
    VP.check_pages(q, k, v, block_table, batch, max_k)
    check_qkv(q, k[:, 0], v[:, 0], layout_kv="(num_blocks, page_block_size, Hkv, D) pages")  # dtypes, heads, D
    if check_values and not _capturing(device):
        check_cu_seqlens("cu_seqlens_k", cu_k, int(cu_k[-1]) if cu_k.numel() else 0, max_k, device, batch,
                         read_values=True)
        VP.check_page_values(block_table, cu_k, k.shape[0], k.shape[1])
    else:
        check_cu_seqlens("cu_seqlens_k", cu_k, batch * max_k, max_k, device, batch, read_values=False)
    k2, v2 = VP.gather_pages(k, v, block_table, cu_k, batch, max_k)
    if torch.compiler.is_compiling():
        if check_values:
            raise ValueError("check_values=True reads block_table on the host, which torch.compile cannot trace")
        return _traced(q, k2, v2, cu_q, cu_k, max_q, max_k, softmax_scale, softcap, band, return_lse, False, False,
                       sinks)
    if check_values:
        check_errors(device)
    else:
        _poll_errors(device)
    return _run(q, k2, v2, cu_q, cu_k, batch, max_q, max_k, softmax_scale, softcap, band, return_lse, False, device,
                sinks)


def _check_fa2_options(alibi_slopes, deterministic, return_attn_probs, check_values) -> None:
    """flash-attn 2's options rocmflash takes (bools) or refuses (one-line ``NotImplementedError``s)."""
    if alibi_slopes is not None:
        raise NotImplementedError("rocmflash: ALiBi (alibi_slopes) is not implemented; pass alibi_slopes=None")
    for name, flag in (("deterministic", deterministic), ("return_attn_probs", return_attn_probs),
                       ("check_values", check_values)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")


def _incumbent_serves(q, k, v, cu_q, cu_k, max_k: int, softmax_scale, softcap, left: int, right: int,
                      return_lse, deterministic: bool = False) -> Optional[tuple]:
    """Whether the platform's varlen attention serves this call (:mod:`rocmflash.api.varlen_incumbent`), as the
    problem's key for :func:`rocmflash.api.varlen_incumbent.run_served` (None: it does not): a plain call
    (no LSE, window or cap; causal with one ``cu_seqlens`` tensor) whose varlen entry says it won, by the forward
    times or, when the call needs gradients, the training steps' (not in deterministic mode nor with
    ``deterministic=True``: its backward uses atomics)."""
    if return_lse or softcap or left != M.UNBOUNDED or right not in (0, M.UNBOUNDED):
        return None
    causal = right == 0
    train = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if train and (deterministic or torch.are_deterministic_algorithms_enabled()):
        return None
    group = q.shape[1] // k.shape[1]
    key = VI.served_key(q.device, q.shape[2], q.dtype, causal, group, max(1, int(max_k)), train)
    return key if key is not None and VI.excludes(causal, cu_q is cu_k, group, q.shape[2], softmax_scale) is None \
        else None


def _equal_lengths(batch: int, total_q: int, total_k: int, max_q: int, max_k: int) -> bool:
    """Whether every sequence is ``max_q`` queries and ``max_k`` keys long, from sizes alone (no host read): the
    lengths sum to the packed rows and none exceeds its ``max_seqlen``, so ``batch * max == total`` leaves no room
    for a shorter one. (Values that break those rules are the caller's error, reported as the kernels report it.)"""
    return batch > 0 and max_q > 0 and max_k > 0 and batch * max_q == total_q and batch * max_k == total_k


_DENSE = []


def _as_dense_batch(q, k, v, cu_q, cu_k, batch: int, max_q: int, max_k: int, softmax_scale, causal: bool,
                    values_checked: bool, deterministic: bool = False):
    """An equal-length packed batch as the ``(batch, S, H, D)`` batch it is (views, no copy), through
    :func:`rocmflash.flash_attn_func`: the dense path, with its database entry and its incumbent (SDPA where that
    was faster), where the varlen kernel spends time on per-sequence bounds for nothing (H100, 8 x 4096 keys,
    GQA 4, causal: the dense path took 0.76x the varlen kernel's time forward, 0.67x forward+backward;
    ``docs/evidence/varlen-dense-route-2026-11-27-h100.md``). Causal masking is bottom-right aligned in both. The
    cumulative lengths are not read on the host (unless ``check_values`` did already): one tiny launch checks
    them by the forward's rules and reports through the same error word."""
    if not values_checked:
        with L.on_device(q):
            VK.launch_length_check(cu_q, cu_k, batch, q.shape[0], k.shape[0], max_q, max_k)
        if q.device.type != "cuda":  # Triton's interpreter: reading the word waits for nothing
            _read_and_report(q.device, "this call")
    if not _DENSE:
        from rocmflash.api.attention import flash_attn_func

        _DENSE.append(flash_attn_func)
    out = _DENSE[0](q.unflatten(0, (batch, max_q)), k.unflatten(0, (batch, max_k)), v.unflatten(0, (batch, max_k)),
                    softmax_scale=softmax_scale, causal=causal, deterministic=deterministic)
    return out.flatten(0, 1)


def packed_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float,
                  causal: bool, window_left: int, softcap: float, sinks=None):
    """:func:`flash_attn_varlen_func` over a packing built on the device (the HF integration): the last
    ``cu_seqlens`` entries may stop short of the packed rows -- the rows after them are unused, zero in the
    output and in the gradients -- so the caller never needs the number of real tokens on the host.
    Values are never read on the host; wrong ones are reported as :func:`flash_attn_varlen_func` says.
    ``sinks``: attention sinks, as :func:`flash_attn_varlen_func`'s ``s_aux`` (transformers' ``s_aux``)."""
    check_qkv(q, k, v)
    left, right = check_options(softmax_scale, causal, (window_left, -1), softcap)
    if sinks is not None:
        sinks = check_sinks(sinks, q.shape[1], q.device)
    if torch.compiler.is_compiling():
        return _traced(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, softcap,
                       (left, right), False, False, False, sinks)
    batch = check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.shape[0], max_seqlen_q, q.device, read_values=False)
    check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, k.shape[0], max_seqlen_k, q.device, batch, read_values=False)
    device = q.device
    _poll_errors(device)
    return _run(q, k, v, cu_seqlens_q, cu_seqlens_k, batch, max_seqlen_q, max_seqlen_k, softmax_scale, softcap,
                (left, right), False, False, device, sinks)


def _run(q, k, v, cu_q, cu_k, batch: int, max_q: int, max_k: int, softmax_scale, softcap, band: tuple,
         return_lse, strict_end: bool, device, sinks=None):
    """Launch a validated call (autograd); on the CPU, report what its kernel found wrong at once.
    ``sinks``: checked fp32 ``(Hq,)`` attention-sink logits (:func:`rocmflash.api.sinks.check_sinks`) or None."""
    D = q.shape[2]
    left, right = band
    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(D)
    call = VK.VarlenCall(batch, q.shape[1], k.shape[1], D, int(max_q), int(max_k), scale, float(softcap), left, right,
                         strict_end)
    fwd_cfg = _forward_config(device, D, q.dtype, right == 0, call.group, int(max_k), float(softcap), left)
    out, lse = _VarlenAttention.apply(q, k, v, cu_q, cu_k, call, fwd_cfg, bool(return_lse), sinks)
    if device.type != "cuda" and q.shape[0]:  # Triton's interpreter: reading the word waits for nothing
        _read_and_report(device, "this call")
    return (out, lse) if return_lse else out


def _traced(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale, softcap, band: tuple, return_lse, strict_end: bool,
            check_values: bool, sinks=None):
    """What :func:`flash_attn_varlen_func` and :func:`packed_varlen` run while torch.compile traces, after their
    option checks: ``cu_seqlens``' metadata checked at trace time, then one ``torch.ops.rocmflash.varlen_fwd``
    (:mod:`rocmflash.api.varlen_ops`), differentiable through ``varlen_bwd``. No dense route and no incumbent (as
    the dense op while tracing: one op keeps the graph whole); the values' checks, the error words and the config
    are the op's, per call at run time. ``sinks``: checked attention sinks (the op's last argument)."""
    batch = check_cu_seqlens("cu_seqlens_q", cu_q, q.shape[0], max_q, q.device, read_values=False)
    check_cu_seqlens("cu_seqlens_k", cu_k, k.shape[0], max_k, q.device, batch, read_values=False)
    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(q.shape[2])
    out, lse = torch.ops.rocmflash.varlen_fwd(q, k, v, cu_q, cu_k, max_q, max_k, scale, float(softcap), band[0],
                                              band[1], strict_end, check_values, sinks)
    return (out, lse) if return_lse else out


__all__ = ["flash_attn_varlen_func", "check_errors", "ERROR_POLL_CALLS"]
