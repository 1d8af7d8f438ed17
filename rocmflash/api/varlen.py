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

This module routes each call to one of three paths: the dense path (:func:`rocmflash.flash_attn_func`, for equal
lengths), the platform's varlen attention (:mod:`rocmflash.api.varlen_incumbent`) or rocmflash's packed kernel
(:mod:`rocmflash.api.varlen_kernel`). The argument checks live in :mod:`rocmflash.api.varlen_checks`, the error
word's report in :mod:`rocmflash.api.varlen_errors`; their public names are re-exported here.
"""

from __future__ import annotations

from typing import Optional

from rocmflash.hw.compat import require_supported_versions

require_supported_versions()

import torch  # noqa: E402

from rocmflash.kernels import masks as M  # noqa: E402
from rocmflash.kernels.varlen import host as VK  # noqa: E402
from rocmflash.kernels import launch as L  # noqa: E402
from rocmflash.api.sinks import check_sinks  # noqa: E402
from rocmflash.api import varlen_errors as VE  # noqa: E402
from rocmflash.api import varlen_kernel as VR  # noqa: E402
from rocmflash.api.varlen_checks import (  # noqa: E402,F401  (re-exported: the code moved there)
    _capturing,
    _check_fa2_options,
    _check_tensor,
    check_cu_seqlens,
    check_options,
    check_qkv,
)
from rocmflash.api.varlen_errors import ERROR_POLL_CALLS, check_errors  # noqa: E402,F401 (re-exported)
# re-exported: the code moved there (``_run``: the validated kernel call benchmarks/varlen.py times)
from rocmflash.api.varlen_kernel import _run, packed_varlen  # noqa: E402,F401
from rocmflash.api import varlen_incumbent as VI  # noqa: E402


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
        return VR._traced(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, softcap,
                          (left, right), return_lse, True, check_values, sinks)
    # with check_values, what earlier unchecked calls on this device left is reported too (this call waits anyway)
    batch = VR.checked_lengths(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, check_values)
    device = q.device
    if sinks is not None:  # neither the dense route's incumbent nor the platform's varlen attention has sinks
        return VR._run(q, k, v, cu_seqlens_q, cu_seqlens_k, batch, max_seqlen_q, max_seqlen_k, softmax_scale,
                       softcap, (left, right), return_lse, True, device, sinks)
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
                VE._read_and_report(device, "this call")
            return out
    return VR._run(q, k, v, cu_seqlens_q, cu_seqlens_k, batch, max_seqlen_q, max_seqlen_k, softmax_scale, softcap,
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
        return VR._traced(q, k2, v2, cu_q, cu_k, max_q, max_k, softmax_scale, softcap, band, return_lse, False, False,
                          sinks)
    if check_values:
        VE.check_errors(device)
    else:
        VE._poll_errors(device)
    return VR._run(q, k2, v2, cu_q, cu_k, batch, max_q, max_k, softmax_scale, softcap, band, return_lse, False,
                   device, sinks)


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
            VE._read_and_report(q.device, "this call")
    if not _DENSE:
        from rocmflash.api.attention import flash_attn_func

        _DENSE.append(flash_attn_func)
    out = _DENSE[0](q.unflatten(0, (batch, max_q)), k.unflatten(0, (batch, max_k)), v.unflatten(0, (batch, max_k)),
                    softmax_scale=softmax_scale, causal=causal, deterministic=deterministic)
    return out.flatten(0, 1)


__all__ = ["flash_attn_varlen_func", "check_errors", "ERROR_POLL_CALLS"]
