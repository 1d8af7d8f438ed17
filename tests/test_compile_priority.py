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

    monkeypatch.setattr(SC.os, "nice", refuse)
    SC._lower_priority(5)  # no exception: the compile runs at the priority it has
