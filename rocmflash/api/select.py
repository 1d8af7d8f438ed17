"""The run-time choice in one place: which config a call runs, where it came from, and who serves it.

``SELECTOR.choose(family, problem, device)`` answers for every kernel family the entry points run:

========== =========================================================== ====================================
family     problem keys                                                the config
========== =========================================================== ====================================
forward    head_dim, dtype, causal, gqa_ratio, seqlen_q, seqlen_k,     ``KernelConfig``
           [variant]
backward   head_dim, dtype, causal, gqa_ratio, seqlen_k                ``BwdConfig``
varlen     head_dim, dtype, causal, gqa_ratio, max_seqlen_k            ``KernelConfig``
varlen_bwd head_dim, dtype, causal, gqa_ratio, max_seqlen_k,           ``BwdConfig``
           [softcap, window]
decode     head_dim, dtype, group, seqlen_k, batch, [page_size,        ``DecodeConfig``
           kv_fp8]
fp8        head_dim, dtype (an fp8 torch dtype), causal, gqa_ratio,    ``KernelConfig`` (online)
           seqlen_k
========== =========================================================== ====================================

The rules themselves (database entry of the nearest bucket, else the per-arch default; the first-use build check;
the incumbent an entry names) are the per-family selectors' (:mod:`rocmflash.api.selection`,
:mod:`rocmflash.api.decode_choice`, :mod:`rocmflash.api.selection_fp8`), which the entry points call directly on their hot path (a dict read per
call). This module is their one front: one :meth:`Selector.choose`, one :meth:`Selector.clear` that forgets every
kept choice and every plan built on one, and :meth:`Selector.override`, the one way for the tuner and the tests to
force a config (no monkeypatching of the selectors).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Iterator, Optional

from rocmflash.api import decode_choice, selection

FAMILIES = ("forward", "backward", "varlen", "varlen_bwd", "decode", "fp8")
_REQUIRED = {
    "forward": ("head_dim", "dtype", "causal", "gqa_ratio", "seqlen_q", "seqlen_k"),
    "backward": ("head_dim", "dtype", "causal", "gqa_ratio", "seqlen_k"),
    "varlen": ("head_dim", "dtype", "causal", "gqa_ratio", "max_seqlen_k"),
    "varlen_bwd": ("head_dim", "dtype", "causal", "gqa_ratio", "max_seqlen_k"),
    "decode": ("head_dim", "dtype", "group", "seqlen_k", "batch"),
    "fp8": ("head_dim", "dtype", "causal", "gqa_ratio", "seqlen_k"),
}
_OPTIONAL = {"forward": ("variant",), "backward": (), "varlen": (), "varlen_bwd": ("softcap", "window"),
             "decode": ("page_size", "kv_fp8"), "fp8": ()}


@dataclasses.dataclass(frozen=True)
class Choice:
    """What a call of ``family`` runs: ``config``; ``source`` (``"db"``, ``"default"``, ``"override"``, and the
    packed families' ``"varlen-db"`` / ``"dense"`` / ``"dense-db"``); ``served_by`` (``"rocmflash"``, or
    ``"sdpa:<backend>"`` where the served entry says the platform's SDPA is faster: forward only); ``entry``
    (the database key, or None); ``details`` (the selector's own record, e.g. its log line and build check)."""

    family: str
    config: Any
    source: str
    served_by: str = "rocmflash"
    entry: Optional[str] = None
    details: Optional[dict] = None


def _check_problem(family: str, problem: dict) -> None:
    if family not in FAMILIES:
        raise ValueError(f"family={family!r} is unknown; expected one of {FAMILIES}")
    missing = [k for k in _REQUIRED[family] if k not in problem]
    unknown = sorted(set(problem) - set(_REQUIRED[family]) - set(_OPTIONAL[family]))
    if missing or unknown:
        raise ValueError(f"a {family} problem takes {_REQUIRED[family]} (optional {_OPTIONAL[family]}); "
                         f"missing {missing}, unknown {unknown}")


class Selector:
    """The run-time choice of every family (module docstring). One instance, :data:`SELECTOR`."""

    def choose(self, family: str, problem: dict, device) -> Choice:
        """The :class:`Choice` for ``problem`` (a dict of the family's keys, module docstring) on ``device``."""
        _check_problem(family, problem)
        p = dict(problem)
        forced = selection.overridden(family)
        if family == "decode":
            cfg = decode_choice.decode_config(device, p["head_dim"], p["dtype"], p["group"], p["seqlen_k"],
                                              p["batch"], p.get("page_size", 0), p.get("kv_fp8", False))
            return Choice(family, cfg, "override" if forced is not None else "db-or-default")
        if family == "fp8":
            return _choose_fp8(p, device, forced)
        if family == "forward":
            variant = p.get("variant", "online")
            args = (device, p["head_dim"], p["dtype"], p["causal"], p["gqa_ratio"])
            cfg = selection.select_config(*args, p["seqlen_q"], p["seqlen_k"], variant)
            details = selection.selection_details(*args, p["seqlen_k"], variant)
            backend = selection.select_incumbent(*args, p["seqlen_k"])  # None under an override
            served = f"sdpa:{backend}" if backend else "rocmflash"
        elif family == "backward":
            args = (device, p["head_dim"], p["dtype"], p["causal"], p["gqa_ratio"], p["seqlen_k"])
            cfg, details, served = selection.select_bwd_config(*args), selection.bwd_selection_details(*args), \
                "rocmflash"
        elif family == "varlen":
            args = (device, p["head_dim"], p["dtype"], p["causal"], p["gqa_ratio"], p["max_seqlen_k"])
            cfg, details, served = selection.select_varlen_config(*args), selection.varlen_selection_details(*args), \
                "rocmflash"
        else:
            args = (device, p["head_dim"], p["dtype"], p["causal"], p["gqa_ratio"], p["max_seqlen_k"],
                    p.get("softcap", False), p.get("window", False))
            cfg = selection.select_varlen_bwd_config(*args)
            details, served = selection.varlen_bwd_selection_details(*args), "rocmflash"
        if forced is not None:
            return Choice(family, cfg, "override", "rocmflash")
        details = details or {}
        return Choice(family, cfg, details.get("source", "default"), served, details.get("entry"), details or None)

    def clear(self) -> None:
        """Forget every kept choice (all families) and everything built on one: detected devices, database
        caches, the entry points' call plans, decode plans (call it after writing a database in-process)."""
        from rocmflash.api import decode

        selection.clear_cache()
        decode.clear_cache()

    @contextlib.contextmanager
    def override(self, family: str, config) -> Iterator["Selector"]:
        """Within: every problem of ``family`` runs ``config`` (a config object of the family's kind, or its
        dict), and rocmflash's kernel serves it (no incumbent). Kept choices and plans are forgotten on entry
        and on exit, so no call keeps a config across the swap. Nested overrides of one family restore the
        outer one on exit."""
        if family not in FAMILIES:
            raise ValueError(f"family={family!r} is unknown; expected one of {FAMILIES}")
        config = _as_config(family, config)
        before = selection.overridden(family)
        selection.set_override(family, config)
        self.clear()
        try:
            yield self
        finally:
            selection.set_override(family, before)
            self.clear()


def _choose_fp8(p: dict, device, forced) -> Choice:
    """The fp8 forward's choice: the measured entry of the inputs' own fp8 format, else the fp8 kernel's per-arch
    default (what ``attention`` runs for fp8 q/k/v without ``config=``); rocmflash's kernel always serves
    (SDPA has no fp8 path here)."""
    from rocmflash.api.selection_fp8 import fp8_selection_details, select_fp8_config
    from rocmflash.kernels.fp8.forward import default_config

    if forced is not None:
        return Choice("fp8", forced, "override", "rocmflash")
    args = (device, p["head_dim"], p["dtype"], p["causal"], p["gqa_ratio"], p["seqlen_k"])
    cfg = select_fp8_config(*args)
    details = fp8_selection_details(*args) or {}
    if cfg is None:
        cfg = default_config(selection.device_identity(device)[1], p["head_dim"])
        return Choice("fp8", cfg, "default", "rocmflash", None, details or None)
    return Choice("fp8", cfg, details.get("source", "db"), "rocmflash", details.get("entry"), details or None)


def _as_config(family: str, config):
    """``config`` as the family's config object (a dict is read as the database stores it)."""
    if not isinstance(config, dict):
        return config
    if family == "decode":
        from rocmflash.kernels.decode.host import DecodeConfig

        return DecodeConfig.from_dict(config)
    if family in ("backward", "varlen_bwd"):
        from rocmflash.db.lookups.backward import entry_config

        return entry_config({"best": config})
    from rocmflash.config import KernelConfig

    return KernelConfig.from_dict(config).validate()


SELECTOR = Selector()

__all__ = ["SELECTOR", "Selector", "Choice", "FAMILIES"]
