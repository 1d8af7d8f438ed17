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

from rocmflash.static.prune import PruneSettings, judge, prune


def _config_key(config) -> str:
    return json.dumps(config if isinstance(config, dict) else config.to_dict(), sort_keys=True)


class SurvivorStream:
    """Which configs of a static phase are certain survivors, as observations arrive (module docstring).

    ``configs``: the static phase's configs in compile order; ``on_release(list of (index, observation,
    verdict))``: called (on the thread that adds) with the newly certain survivors, in compile order (config
    ``index`` needed configs ``0..index`` observed).

    A family pruned per kernel (the backward) passes ``group(config)``: each group is pruned on its own (its own
    duplicate binaries), and the groups release in ``stages`` order (default: as they first appear in the
    compile order): a group's survivors wait until every earlier group is wholly observed (the backward's dQ
    configs are all handed out before any dK/dV config, as without streaming). ``settle``: when a group is wholly
    observed, also release what :func:`~rocmflash.static.prune.prune` keeps of it that was not released (its
    "kept anyway" config). ``always``: configs timed whatever their verdict (a family's default), released when
    their group is wholly observed unless released before (one not among ``configs`` holds its group, and the
    later stages, until the static phase ends). :meth:`needs` says how many configs of the compile
    order a released config waited for."""

    def __init__(self, configs: list, settings, on_release: Callable[[list], None],
                 group: Optional[Callable] = None, stages: Optional[tuple] = None, settle: bool = False,
                 always: tuple = ()):
        self.configs = list(configs)
        self.settings = settings if settings is not None else PruneSettings()
        self.on_release = on_release
        self._index = {_config_key(c): i for i, c in enumerate(self.configs)}
        self._obs: list = [None] * len(self.configs)
        self.prefix = 0  #: configs 0..prefix-1 are observed
        self._group = [group(c) if group is not None else None for c in self.configs]
        order = list(dict.fromkeys(self._group))
        self.stages = list(stages) if stages is not None else order
        unknown = [g for g in order if g not in self.stages]
        if unknown:
            raise ValueError(f"configs of group(s) {unknown!r} are in no stage of {self.stages!r}")
        self._members = {g: [i for i, k in enumerate(self._group) if k == g] for g in self.stages}
        self._pos = dict.fromkeys(self.stages, 0)  #: per group: its members 0..pos-1 are observed
        self._kept = {g: set() for g in self.stages}  #: per group: binaries of its released survivors
        self._held = {g: [] for g in self.stages}  #: per group: certain survivors waiting for an earlier stage
        self._stage = 0  #: stages before it are wholly observed and released
        self.settle = settle
        self._always = {self._index[_config_key(c)] for c in always if _config_key(c) in self._index}
        #: groups with an ``always`` config not among ``configs`` (timed with no observation here): they and every
        #: later stage release nothing more while streaming (the static phase's end hands the rest out in order)
        self._open = {group(c) if group is not None else None for c in always if _config_key(c) not in self._index}
        self._needs: dict = {}  #: released index -> configs of the compile order it waited for
        self._lock = threading.Lock()

    def add(self, observation: dict) -> None:
        """One compile result (a cache hit or a fresh compile), in any order; unknown configs are ignored."""
        i = self._index.get(_config_key(observation.get("config") or {}))
        with self._lock:
            if i is None or self._obs[i] is not None:
                return
            self._obs[i] = observation
            while self.prefix < len(self._obs) and self._obs[self.prefix] is not None:
                self.prefix += 1
            g = self._group[i]
            members = self._members[g]
            while self._pos[g] < len(members) and self._obs[members[self._pos[g]]] is not None:
                j = members[self._pos[g]]
                obs = self._obs[j]
                verdict = judge(obs, self.settings)
                if verdict.kept and obs.get("binary_sha256") not in self._kept[g]:
                    self._kept[g].add(obs.get("binary_sha256"))
                    self._held[g].append((j, obs, verdict))  # (a later kept twin: prune() says duplicate)
                self._pos[g] += 1
            released = self._flush()
        if released:
            self.on_release(released)

    def _flush(self) -> list:
        """The held survivors of every stage whose earlier stages are wholly observed (under the lock)."""
        out: list = []
        while self._stage < len(self.stages):
            g = self.stages[self._stage]
            out += self._mark(self._held[g], g)
            self._held[g] = []
            if self._pos[g] < len(self._members[g]) or g in self._open:
                break
            out += self._mark(self._settled(g, {j for j, _, _ in out}), g, whole=True)
            self._stage += 1
        return out

    def _settled(self, g, released: set) -> list:
        """A wholly observed group's configs to release besides its streamed survivors (``settle``, ``always``)."""
        members, extra = self._members[g], []
        done = released | set(self._needs)
        if self.settle and members:
            for j, verdict in zip(members, prune([self._obs[j] for j in members], self.settings)):
                if verdict.kept and j not in done:
                    extra.append((j, self._obs[j], verdict))
                    done.add(j)
        extra += [(j, self._obs[j], judge(self._obs[j], self.settings)) for j in members
                  if j in self._always and j not in done]
        return sorted(extra, key=lambda e: e[0])

    def _mark(self, entries: list, g, whole: bool = False) -> list:
        """Note what each released entry waited for: its group up to it (``whole``: all of it) and every earlier
        stage."""
        earlier = [i for s in self.stages[:self.stages.index(g)] for i in self._members[s]]
        for j, _, _ in entries:
            self._needs[j] = max([max(self._members[g]) if whole else j] + earlier) + 1
        return entries

    def needs(self, index: int) -> int:
        """How many configs of the compile order (a prefix) a released config waited for (the simulated clock)."""
        return self._needs.get(index, index + 1)

    def compile_seconds(self) -> list:
        """Compile seconds per config in compile order (0: not observed, or unknown)."""
        return [(obs or {}).get("compile_seconds") or 0.0 for obs in self._obs]


#: how many pre-warms of released configs run at once (each on its own helper thread, in the kept pre-warm pool)
PREWARM_THREADS = 16


class ReadyQueue:
    """Released configs, pre-warmed by ``prewarm(list of entries)`` on helper threads (None: ready at once), then
    ready to time; ``notify()`` after each pre-warm ends. Up to ``threads`` pre-warms run at once, each taking its
    share of what is waiting (one entry each while few wait), so an entry is ready when its own pre-warm ends:
    a slow build (a compile the static phase did not make) holds back only the entries that went with it, and
    a config released while others pre-warm starts at once. Entries are whatever the caller puts (the forward
    item: ``(index, candidate)``)."""

    def __init__(self, prewarm: Optional[Callable[[list], None]], notify: Callable[[], None],
                 threads: int = PREWARM_THREADS):
        self.prewarm, self.notify = prewarm, notify
        self.threads = max(1, int(threads))
        self._cv = threading.Condition()
        self._pending: list = []
        self.ready: list = []  #: entries ready to time, in the order they became ready
        self._given = 0
        self._closed = False
        self._workers: list = []
        self._busy = 0

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
            idle = len(self._workers) - self._busy
            for _ in range(min(len(self._pending) - idle, self.threads - len(self._workers))):
                thread = threading.Thread(target=self._loop, daemon=True, name="rocmflash-stream-prewarm")
                self._workers.append(thread)
                thread.start()
            self._cv.notify_all()

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._pending and not self._closed:
                    self._cv.wait()
                if not self._pending:
                    return
                share = -(-len(self._pending) // len(self._workers))  # ceil: the waiting split over every thread
                batch, self._pending = self._pending[:share], self._pending[share:]
                self._busy += 1
            try:
                self.prewarm(batch)
            finally:  # a failed pre-warm is an optimisation lost: the timing meets any real error again
                with self._cv:
                    self._busy -= 1
                    self.ready.extend(batch)
                self.notify()

    def close(self) -> None:
        """Wait until every released entry is pre-warmed and ready."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
            workers = list(self._workers)
        for thread in workers:
            thread.join()

    def take(self, upto: Optional[int] = None) -> list:
        """The ready entries not taken yet, up to the first ``upto`` ready (None: all)."""
        with self._cv:
            end = len(self.ready) if upto is None else min(int(upto), len(self.ready))
            out = self.ready[self._given:end]
            self._given = max(self._given, end)
            return out


__all__ = ["SurvivorStream", "ReadyQueue"]
