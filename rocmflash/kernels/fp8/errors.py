"""The fp8 forward's device error word: the bit its kernels set on a non-finite descale product, and how
a call reports it without waiting for the GPU (:func:`poll_errors`) or at once (:func:`check_errors`).

Kernel-side state the launcher (:mod:`rocmflash.kernels.fp8.forward`) and the API (:mod:`rocmflash.api.fp8`,
which re-exports these names) share. The word and its polling are :mod:`rocmflash.kernels.error_words`'
(shared with varlen and decode); this module keeps the bit and what it says.
"""

from __future__ import annotations

from rocmflash.kernels import error_words as EW

# ----------------------------------------------------------------------------- device error word
#: a call starts an asynchronous copy of its device's error word every this many calls
ERROR_POLL_CALLS = 16
BAD_DESCALE = 1  #: error-word bit: a program met a non-finite descale product
ERRORS = EW.ErrorWord()
_ERROR_WORDS = ERRORS.words  #: device -> int32 (1,) tensor the kernel sets bits in
_WATCHES = ERRORS.watches  #: device -> error_words.Watch
_REPORT = EW.Report(
    "fp8 attention",
    ((BAD_DESCALE, ("a non-finite q_descale * k_descale * softmax_scale or v_descale (NaN or inf) for some "
                    "(batch, kv_head)")),),
    "; those rows of its output are not finite")


def error_word(device):
    """The int32 ``(1,)`` word the fp8 forward kernels on ``device`` set :data:`BAD_DESCALE` in (zero until then)."""
    return ERRORS.word(device)


def check_errors(device=None) -> None:
    """Raise ``ValueError`` if an fp8 attention call on ``device`` (None: every device used) met a non-finite
    descale since the last report, and reset the report. Waits for the GPU (reads the device-side word)."""
    for dev in ERRORS.devices(device):
        ERRORS.read_and_report(dev, "a call since the last check", _REPORT)


def poll_errors(device) -> None:
    """After a launch: raise what the error word shows without waiting for a GPU (CPU tensors: read now)."""
    ERRORS.poll(device, _REPORT, ERROR_POLL_CALLS, EW.capturing, cpu_how="this call")
