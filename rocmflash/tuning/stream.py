"""A streamed static phase (issue #29): the configs a race's first round will time, known as compile results
arrive, so a timing worker starts on the first survivors while the rest of the problem still compiles.

:class:`SurvivorStream` decides, from each arriving observation, which configs are certainly survivors of the
whole static phase: config ``i`` is one once configs ``0..i`` are all observed, its own verdict
(:func:`rocmflash.static.prune.judge`) keeps it and no earlier kept config has its code object -- exactly what
:func:`rocmflash.static.prune.prune` decides at the end (its "kept anyway" rule applies only when nothing is
kept, which one released survivor excludes), so a released config is never taken back and the round's field
does not depend on the order compiles finish in. :class:`ReadyQueue` pre-warms released configs in batches on
a helper thread (what the timing worker would otherwise compile in its first measurement) and then marks them
ready to time.
"""

from __future__ import annotations

import json
import threading
from typing import Callable, Optional

from rocmflash.static.prune import judge


def _config_key(config) -> str:
    return json.dumps(config if isinstance(config, dict) else config.to_dict(), sort_keys=True)


class SurvivorStream:
    """Which configs of a static phase are certain survivors, as observations arrive (module docstring).

    ``configs``: the static phase's configs in compile order; ``on_release(list of (index, observation,
    verdict))``: called (on the thread that adds) with the newly certain survivors, in compile order (config
    ``index`` needed configs ``0..index`` observed)."""

    def __init__(self, configs: list, settings, on_release: Callable[[list], None]):
        self.configs = list(configs)
        self.settings = settings
        self.on_release = on_release
        self._index = {_config_key(c): i for i, c in enumerate(self.configs)}
        self._obs: list = [None] * len(self.configs)
        self.prefix = 0  #: configs 0..prefix-1 are observed
        self._kept_binaries: set = set()
        self._lock = threading.Lock()

    def add(self, observation: dict) -> None:
        """One compile result (a cache hit or a fresh compile), in any order; unknown configs are ignored."""
        i = self._index.get(_config_key(observation.get("config") or {}))
        with self._lock:
            if i is None or self._obs[i] is not None:
                return
            self._obs[i] = observation
            released = []
            while self.prefix < len(self._obs) and self._obs[self.prefix] is not None:
                obs = self._obs[self.prefix]
                verdict = judge(obs, self.settings)
                if verdict.kept and obs.get("binary_sha256") not in self._kept_binaries:
                    self._kept_binaries.add(obs.get("binary_sha256"))
                    released.append((self.prefix, obs, verdict))  # (a later kept twin: prune() says duplicate)
                self.prefix += 1
        if released:
            self.on_release(released)


class ReadyQueue:
    """Released configs, pre-warmed in batches by ``prewarm(list of entries)`` on a helper thread (None: ready at
    once), then ready to time; ``notify()`` after each batch becomes ready. Entries are whatever the caller
    puts (the forward item: ``(index, candidate, prefix)``)."""

    def __init__(self, prewarm: Optional[Callable[[list], None]], notify: Callable[[], None]):
        self.prewarm, self.notify = prewarm, notify
        self._cv = threading.Condition()
        self._pending: list = []
        self.ready: list = []  #: entries ready to time, in the order they became ready
        self._given = 0
        self._closed = False
        self._thread: Optional[threading.Thread] = None

    def put(self, entries: list) -> None:
        if not entries:
            return
        if self.prewarm is None:
            with self._cv:
                self.ready.extend(entries)
            self.notify()
            return
        with self._cv:
            self._pending.extend(entries)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, daemon=True, name="rocmflash-stream-prewarm")
                self._thread.start()
            self._cv.notify()

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._pending and not self._closed:
                    self._cv.wait()
                if not self._pending:
                    return
                batch, self._pending = self._pending, []
            try:
                self.prewarm(batch)
            finally:  # a failed pre-warm is an optimisation lost: the timing meets any real error again
                with self._cv:
                    self.ready.extend(batch)
                self.notify()

    def close(self) -> None:
        """Wait until every released entry is pre-warmed and ready."""
        with self._cv:
            self._closed = True
            self._cv.notify()
            thread = self._thread
        if thread is not None:
            thread.join()

    def take(self, upto: Optional[int] = None) -> list:
        """The ready entries not taken yet, up to the first ``upto`` ready (None: all)."""
        with self._cv:
            end = len(self.ready) if upto is None else min(int(upto), len(self.ready))
            out = self.ready[self._given:end]
            self._given = max(self._given, end)
            return out


__all__ = ["SurvivorStream", "ReadyQueue"]
