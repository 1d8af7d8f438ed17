"""The varlen error word's host side: how ``flash_attn_varlen_func`` reports ``cu_seqlens`` values its kernels clamped.

The varlen kernels OR bits (:mod:`rocmflash.kernels.varlen.checks`: ``cu_seqlens`` not starting at 0, not ending
at the packed length, decreasing, a sequence longer than ``max_seqlen``; the paged prefill's bad pages) into a
per-device int32 word instead of the host reading tensor values (a wait per call). :func:`check_errors` reads it
(waits); every call polls an asynchronous copy (:func:`_poll_errors`); on the CPU the call reads it right after its
launch (:func:`_read_and_report`). The word and its polling are :mod:`rocmflash.kernels.error_words`' (shared with
decode and the fp8 forward, :mod:`rocmflash.api.decode_errors`); this module keeps what the bits say.
:mod:`rocmflash.api.varlen` re-exports :func:`check_errors` and :data:`ERROR_POLL_CALLS`.
"""

from __future__ import annotations

from rocmflash.api.varlen_paged import BAD_PAGE, BAD_PAGE_TEXT
from rocmflash.kernels import error_words as EW
from rocmflash.kernels.varlen import checks as VC

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
_capturing = EW.capturing  #: whether a CUDA graph is being captured on the device (no copy is started then)


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
    :func:`rocmflash.api.varlen.flash_attn_varlen_func` reads the word right after its launch: there is no GPU to
    wait for.)"""
    VC.ERRORS.poll(device, _REPORT, ERROR_POLL_CALLS, _capturing)


__all__ = ["ERROR_POLL_CALLS", "check_errors"]
