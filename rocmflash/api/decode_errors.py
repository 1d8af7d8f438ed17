"""The decode error word's host side: how ``flash_attn_with_kvcache`` reports values its kernels had to clamp.

The decode kernels and the appends OR bits (:data:`rocmflash.kernels.decode.host.BAD_LENGTH`, ``BAD_START``,
``BAD_PAGE``, ``BAD_DESCALE``, ``BAD_WIDE``, ``BAD_SINK``, ``NOT_STORED``: :mod:`rocmflash.kernels.decode.checks`) into a
per-device int32 word instead of the host reading tensor values (a wait per call). :func:`check_errors` reads it
(waits); every call polls an asynchronous copy (:func:`_poll_errors`).
The word and its polling are :mod:`rocmflash.kernels.error_words`' (shared with varlen and the fp8
forward); this module keeps what the bits say. :mod:`rocmflash.api.decode` re-exports :func:`check_errors`
and :data:`ERROR_POLL_CALLS`.
"""

from __future__ import annotations

from rocmflash.kernels import error_words as EW
from rocmflash.kernels.decode import host as KD
from rocmflash.kernels.decode import checks as DC

#: a default call starts an asynchronous copy of its device's error word every this many calls
ERROR_POLL_CALLS = 64
#: what each bit says; the appends set NOT_STORED with the bit of the value that kept a sequence's new k/v out of
#: the cache (the kernels mask that sequence's stores and read only rows inside the cache in its place)
_REPORT = EW.Report(
    "flash_attn_with_kvcache",
    ((DC.BAD_WIDE.value, "an int64 cache_seqlens/cache_leftpad value outside int32 (not a length)"),
     (DC.BAD_LENGTH.value, "cache_seqlens plus the new keys outside the cache"),
     (DC.BAD_START.value, "cache_leftpad outside its sequence"),
     (DC.BAD_PAGE.value, "block_table pointing outside the cache's pages"),
     (DC.BAD_DESCALE.value, "a k_descale/v_descale not finite and > 0 (that call appended nothing)"),
     (DC.BAD_SINK.value, "an s_aux (attention sink) NaN or +inf (its head's rows are NaN)"),
     (DC.NOT_STORED.value, "so those sequences' new k/v were not stored in the cache")),
    " (those sequences' outputs are undefined; no other sequence's rows, no unused page and no memory outside "
    "the cache were written); pass check_values=True to have each call checked on the host, with the index and "
    "value")
_ErrorWatch = EW.Watch
_WATCHES = DC.ERRORS.watches  #: device -> _ErrorWatch
_capturing = EW.capturing


def check_errors(device=None) -> None:
    """Raise ``ValueError`` if a ``flash_attn_with_kvcache`` call on ``device`` (None: every device used)
    met an out-of-range ``cache_seqlens``/``cache_leftpad``/``block_table`` value or a bad fp8 descale since the
    last report, and reset the report. Waits for the GPU (reads the device-side error word).

    The message names each kind of value that was bad, and says when an append therefore stored none of a
    sequence's new k/v: those sequences' outputs are undefined; no other sequence's rows, no unused page and
    no memory outside the cache were written."""
    for dev in DC.ERRORS.devices(device):
        _read_and_report(dev, "a call since the last check")


def _read_and_report(device, how: str) -> None:
    """Read ``device``'s error word (a wait on a GPU) and, when a bit is set, reset it and raise."""
    DC.ERRORS.read_and_report(device, how, _REPORT)


def _poll_errors(device) -> None:
    """Raise what an earlier, finished copy of ``device``'s error word shows; start a copy every
    :data:`ERROR_POLL_CALLS` calls. Never waits (on the CPU, under the interpreter, it reads the word)."""
    DC.ERRORS.poll(device, _REPORT, ERROR_POLL_CALLS, _capturing, cpu_how="an earlier call")
