"""Runners: what times a config on a shape.

A runner has ``measure(config, shape, inject=None, budget=None) -> result dict`` (status,
median_ms, times_ms, tflops, rel_err, error; ``budget`` is a race round's timing budget
and gate flag), optionally ``prewarm(configs, shape)`` and ``close()``, and ``device``
(the name recorded in the database's fingerprint). :class:`rocmflash.tuning.live.LiveRunner`
times on the live GPU in isolated workers; :class:`ReplayRunner` serves recorded or
computed results (tests, re-analysis of a device run).
"""

from __future__ import annotations

import inspect
from typing import Callable, Optional

from rocmflash.config import KernelConfig
from rocmflash.hw.roofline import Shape, tflops

class ReplayRunner:
    """Serves recorded results instead of a GPU (tests, and re-analysis of a device run).

    ``results`` maps ``(shape dict as sorted tuple, config json)`` to a result dict; a
    config with no recording is ``failed``. Build one from a journal (``from_journal``)
    or from a function ``fn(config, shape) -> result`` (``from_function``).
    """

    live = True

    def __init__(self, results: Optional[dict] = None, fn: Optional[Callable] = None, device: str = "replay"):
        self.results = results or {}
        self.fn = fn
        self.device = device
        self.calls: list = []
        self.budgets: list = []  #: the race round budget of each call (None: full settings)

    @staticmethod
    def _key(shape: Shape, cfg: KernelConfig):
        return (tuple(sorted(shape.to_dict().items())), cfg.to_json())

    @classmethod
    def from_function(cls, fn: Callable, device: str = "replay") -> "ReplayRunner":
        return cls(fn=fn, device=device)

    @classmethod
    def from_journal(cls, path: str, device: str = "replay") -> "ReplayRunner":
        import json

        results = {}
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                # forward records only: backward and decode records (``family``) hold other problems and configs
                if isinstance(r, dict) and "config" in r and "shape" in r and r.get("family", "fwd") == "fwd":
                    shape, cfg = Shape.from_dict(r["shape"]), KernelConfig.from_dict(r["config"])
                    results[cls._key(shape, cfg)] = {k: r.get(k) for k in
                                                     ("status", "median_ms", "times_ms", "tflops", "rel_err", "error")}
        return cls(results, device=device)

    def prewarm(self, configs, shape) -> dict:
        return {}

    def measure(self, cfg: KernelConfig, shape: Shape, inject: Optional[str] = None,
                budget: Optional[dict] = None) -> dict:
        self.calls.append((cfg, shape))
        self.budgets.append(budget)
        if inject == "crash":
            return {"status": "crashed", "error": "worker died (injected crash, replay)"}
        if inject in ("hang", "illegal"):
            return {"status": "timeout" if inject == "hang" else "crashed", "error": f"injected {inject} (replay)"}
        if self.fn is not None:
            takes_budget = len(inspect.signature(self.fn).parameters) >= 3
            result = dict(self.fn(cfg, shape, budget) if takes_budget else self.fn(cfg, shape))
        else:
            result = dict(self.results.get(self._key(shape, cfg)) or
                          {"status": "failed", "error": "no recorded result for this config and shape"})
        if result.get("status") == "ok" and result.get("median_ms") and not result.get("tflops"):
            result["tflops"] = tflops(shape, result["median_ms"])
        return result

    def close(self) -> None:
        pass
