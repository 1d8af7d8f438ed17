"""The decode error word's host side: how ``flash_attn_with_kvcache`` reports values its kernels had to clamp.

The decode kernels OR bits (:data:`rocmflash.kernels.kv_decode.BAD_LENGTH`, ``BAD_START``, ``BAD_PAGE``,
``BAD_DESCALE``) into a per-device int32 word instead of the host reading tensor values (a wait per
call). :func:`check_errors` reads it (waits); every call polls an asynchronous copy (:func:`_poll_errors`).
Moved out of :mod:`rocmflash.api.decode`, which re-exports :func:`check_errors` and :data:`ERROR_POLL_CALLS`.
"""

from __future__ import annotations

import torch

from rocmflash.api.varlen import _capturing
from rocmflash.kernels import kv_decode as KD
from rocmflash.kernels import launch as L

#: a default call starts an asynchronous copy of its device's error word every this many calls
ERROR_POLL_CALLS = 64
_ERROR_TEXT = ((KD.BAD_LENGTH.value, "cache_seqlens plus the new keys outside the cache"),
               (KD.BAD_START.value, "cache_leftpad outside its sequence"),
               (KD.BAD_PAGE.value, "block_table pointing outside the cache's pages"),
               (KD.BAD_DESCALE.value, "a k_descale/v_descale not finite and > 0 (that call appended nothing)"))


class _ErrorWatch:
    """One device's watch on its error word: a pinned host copy, the event that completes it, calls since."""

    __slots__ = ("calls", "event", "host")

    def __init__(self):
        self.calls, self.event = 0, None
        self.host = torch.zeros(1, dtype=torch.int32, pin_memory=torch.cuda.is_available())


_WATCHES: dict = {}  #: device -> _ErrorWatch


def _raise_for(bits: int, device, how: str) -> None:
    what = "; ".join(text for bit, text in _ERROR_TEXT if bits & bit)
    raise ValueError(f"flash_attn_with_kvcache on {device}: {how} got {what} (kept inside the cache, so no memory "
                     "outside it was touched, but those sequences' outputs are wrong); pass check_values=True "
                     "to have each call checked on the host, with the index and value")


def check_errors(device=None) -> None:
    """Raise ``ValueError`` if a ``flash_attn_with_kvcache`` call on ``device`` (None: every device used)
    met an out-of-range ``cache_seqlens``/``cache_leftpad``/``block_table`` value or a bad fp8 descale since the
    last report,
    and reset the report. Waits for the GPU (reads the device-side error word)."""
    devices = list(KD._ERROR_WORDS) if device is None else [torch.device(device)]
    for dev in devices:
        _read_and_report(dev, "a call since the last check")


def _read_and_report(device, how: str) -> None:
    """Read ``device``'s error word (a wait on a GPU) and, when a bit is set, reset it and raise."""
    word = KD._ERROR_WORDS.get(device)
    bits = int(word[0]) if word is not None else 0
    if bits:
        word.zero_()
        _raise_for(bits, device, how)


def _poll_errors(device) -> None:
    """Raise what an earlier, finished copy of ``device``'s error word shows; start a copy every
    :data:`ERROR_POLL_CALLS` calls. Never waits (on the CPU, under the interpreter, it reads the word)."""
    if device.type != "cuda":
        _read_and_report(device, "an earlier call")
        return
    watch = _WATCHES.get(device)
    if watch is None:
        watch = _WATCHES[device] = _ErrorWatch()
    if watch.event is not None:
        if _capturing(device):  # Event.query() is not permitted while a graph is captured: look after capture
            return
        if not watch.event.query():
            watch.calls += 1
            return
        watch.event = None
        bits = int(watch.host[0])
        if bits:
            KD.error_word(device).zero_()
            _raise_for(bits, device, "an earlier call")
    watch.calls += 1
    if watch.calls >= ERROR_POLL_CALLS and watch.event is None and not _capturing(device):
        watch.calls = 0
        with L.on_device(KD.error_word(device)):
            watch.host.copy_(KD.error_word(device), non_blocking=True)
            watch.event = torch.cuda.Event()
            watch.event.record()
