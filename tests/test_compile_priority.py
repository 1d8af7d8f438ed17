"""Compile workers yield the CPU to the live tune's processes (#29): a static phase's pool runs below the priority of
the process that started it, so the timing workers and the scheduler get a core the moment they wake."""

from __future__ import annotations

import multiprocessing
import os

import pytest

from rocmflash.static import compile as SC


def _niceness_after_init(cache_dir: str) -> int:
    SC._worker_init(cache_dir)
    return os.nice(0)


@pytest.mark.skipif(not hasattr(os, "nice"), reason="no os.nice on this platform")
def test_a_compile_worker_runs_below_its_parent(tmp_path):
    parent = os.nice(0)
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        child = pool.apply(_niceness_after_init, (str(tmp_path),))
    assert child == min(19, parent + SC.COMPILE_NICENESS)
    assert os.nice(0) == parent  # the caller's own priority is untouched


def test_a_refused_priority_change_is_not_an_error(monkeypatch):
    def refuse(_):
        raise PermissionError("not allowed")

    from rocmflash.hw import platform

    monkeypatch.setattr(os, "nice", refuse)
    platform.lower_priority(5)  # no exception: the worker runs at the priority it has


def _niceness(_task) -> int:
    return os.nice(0)


@pytest.mark.skipif(not hasattr(os, "nice"), reason="no os.nice on this platform")
def test_a_kept_prewarm_worker_runs_below_its_parent_and_above_the_compilers(tmp_path):
    from rocmflash.tuning.isolated import TaskPrewarmPool
    from rocmflash.tuning.live_worker import PREWARM_NICENESS

    parent = os.nice(0)
    pool = TaskPrewarmPool(str(tmp_path), {}, 1)
    try:
        assert pool.run([{}], _niceness, 120) == [min(19, parent + PREWARM_NICENESS)]
    finally:
        pool.close()
    assert 0 < PREWARM_NICENESS < SC.COMPILE_NICENESS
