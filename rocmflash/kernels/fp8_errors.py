"""The fp8 forward's device error word: the bit its kernels set on a non-finite descale product, and how
a call reports it without waiting for the GPU (:func:`poll_errors`) or at once (:func:`check_errors`).

Kernel-side state the launcher (:mod:`rocmflash.kernels.fp8_forward`) and the API (:mod:`rocmflash.api.fp8`,
which re-exports these names) share.
"""

from __future__ import annotations

import torch

# ----------------------------------------------------------------------------- device error word
#: a call starts an asynchronous copy of its device's error word every this many calls
ERROR_POLL_CALLS = 16
BAD_DESCALE = 1  #: error-word bit: a program met a non-finite descale product
_ERROR_WORDS: dict = {}  #: device -> int32 (1,) tensor the kernel sets bits in
_WATCHES: dict = {}  #: device -> _Watch


def error_word(device) -> torch.Tensor:
    """The int32 ``(1,)`` word the fp8 forward kernels on ``device`` set :data:`BAD_DESCALE` in (zero until then)."""
    word = _ERROR_WORDS.get(device)
    if word is None:
        word = _ERROR_WORDS[device] = torch.zeros(1, dtype=torch.int32, device=device)
    return word


class _Watch:
    """One device's pending read of its error word: pinned host copy, the event completing it, calls since."""

    __slots__ = ("calls", "event", "host")

    def __init__(self):
        self.calls, self.event = 0, None
        self.host = torch.zeros(1, dtype=torch.int32, pin_memory=torch.cuda.is_available())


def _raise_for(device, how: str) -> None:
    raise ValueError(f"fp8 attention on {device}: {how} got a non-finite q_descale * k_descale * softmax_scale or "
                     "v_descale (NaN or inf) for some (batch, kv_head); those rows of its output are not finite")


def check_errors(device=None) -> None:
    """Raise ``ValueError`` if an fp8 attention call on ``device`` (None: every device used) met a non-finite
    descale since the last report, and reset the report. Waits for the GPU (reads the device-side word)."""
    devices = list(_ERROR_WORDS) if device is None else [torch.device(device)]
    for dev in devices:
        word = _ERROR_WORDS.get(dev)
        if word is not None and int(word[0]):
            word.zero_()
            _raise_for(dev, "a call since the last check")


def poll_errors(device) -> None:
    """After a launch: raise what the error word shows without waiting for a GPU (CPU tensors: read now)."""
    if device.type != "cuda":
        word = _ERROR_WORDS.get(device)
        if word is not None and int(word[0]):
            word.zero_()
            _raise_for(device, "this call")
        return
    watch = _WATCHES.get(device)
    if watch is None:
        watch = _WATCHES[device] = _Watch()
    if watch.event is not None and watch.event.query():
        watch.event = None
        if int(watch.host[0]):
            error_word(device).zero_()
            _raise_for(device, "an earlier call")
    watch.calls += 1
    if watch.calls >= ERROR_POLL_CALLS and watch.event is None:
        with torch.cuda.device(device):
            if torch.cuda.is_current_stream_capturing():  # a graph replays launches only: no copy to record
                return
            watch.calls = 0
            watch.host.copy_(error_word(device), non_blocking=True)
            watch.event = torch.cuda.Event()
            watch.event.record()
