"""``rocmflash.check_errors``: every device-side error report at once, varlen, decode and fp8 together.

Three kernel families report a value they had to clamp through a per-device error word
(:mod:`rocmflash.kernels.error_words`): ``flash_attn_varlen_func`` (``cu_seqlens``), ``flash_attn_with_kvcache``
(``cache_seqlens``, ``cache_leftpad``, ``block_table``, descales) and the fp8 forward (descales). Each family's
module keeps its own ``check_errors(device=None)`` (:func:`rocmflash.api.varlen.check_errors`,
:func:`rocmflash.api.decode.check_errors`, :func:`rocmflash.api.fp8.check_errors`), which raises on the first
family's first device with a bit set; :func:`check_errors` here reads and clears every family's word on every
device first, then raises one ``ValueError`` naming all of them -- a training step or a test asks once.
"""

from __future__ import annotations

import importlib
import sys

#: per family: the module that keeps its words (``ERRORS``), and the module and name of its Report; in message order
_FAMILIES = (("rocmflash.kernels.varlen.checks", "rocmflash.api.varlen_errors", "_REPORT"),
             ("rocmflash.kernels.decode.checks", "rocmflash.api.decode_errors", "_REPORT"),
             ("rocmflash.kernels.fp8.errors", "rocmflash.kernels.fp8.errors", "_REPORT"))
HOW = "a call since the last check"  #: what each message says reported the bits (as the families' own checks)


def check_errors(device=None) -> None:
    """Raise one ``ValueError`` if any varlen, decode or fp8 attention call on ``device`` (None: every device
    used) met a value its kernels had to clamp since the last report, and clear the reports.

    Every family's error word on every such device is read and cleared (atomically: a bit a kernel sets
    meanwhile is kept for the next report) before anything is raised, so one call reports all of them: the
    message is each family's own, as its module's ``check_errors`` words it, joined by ``" | "``. Waits for the
    GPU (reads the device-side words): call it where a step may wait, e.g. once per training step."""
    messages = []
    for words_module, report_module, report_name in _FAMILIES:
        module = sys.modules.get(words_module)
        if module is None:  # never imported: none of its kernels ran, so it has no word
            continue
        errors = module.ERRORS
        for dev in errors.devices(device):
            bits = errors.read_bits(dev)
            if bits:
                report = getattr(importlib.import_module(report_module), report_name)
                messages.append(report.message(bits, dev, HOW))
    if len(messages) == 1:
        raise ValueError(messages[0])
    if messages:
        raise ValueError(f"{len(messages)} device-side error reports: " + " | ".join(messages))


__all__ = ["check_errors"]
