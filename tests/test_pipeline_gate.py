"""A plan made on the GPU kind read without torch (issue #29, a cold multi-GPU tune's first seconds): the
pipeline's ``gate`` runs once, before the first job or the first entry, and a discarded plan writes nothing."""

import time

import pytest

from rocmflash.tuning.pipeline import Pipeline
from rocmflash.tuning.pipeline_exec import SimulatedExecutor, ThreadExecutor
from rocmflash.tuning.pool import DiscardPlan
from test_pipeline import FakeItem, FakeRunner


class Gate:
    def __init__(self, error=None, log=None):
        self.calls, self.error, self.log = 0, error, log

    def __call__(self):
        self.calls += 1
        if self.log is not None:
            self.log.append("gate")
        if self.error is not None:
            raise self.error


def _executor(kind):
    return SimulatedExecutor() if kind == "sim" else ThreadExecutor()


@pytest.mark.parametrize("executor", ["sim", "threads"])
def test_the_gate_runs_once_before_the_first_job_and_the_run_goes_on(executor):
    log = []
    a = FakeItem("A", [[("a1", 1), ("a2", 1)], [("a3", 1)]], compile_s=[0.5])
    b = FakeItem("B", [[("b1", 1)]], compile_s=[0.5])
    runner = FakeRunner("r0")
    runner_time = runner.time
    runner.time = lambda label, seconds: log.append(label) or runner_time(label, seconds)
    gate = Gate(log=log)
    Pipeline([a, b], [runner, FakeRunner("r1")], executor=_executor(executor), gate=gate).run()
    assert gate.calls == 1 and log[0] == "gate"
    assert a.finished == [True] and b.finished == [True]
    assert sorted(lbl for lbl, _ in a.recorded + b.recorded) == ["a1", "a2", "a3", "b1"]


@pytest.mark.parametrize("executor", ["sim", "threads"])
def test_a_discarded_plan_times_nothing_and_finishes_no_item(executor):
    a = FakeItem("A", [[("a1", 1)]], compile_s=[0.5])
    b = FakeItem("B", [[("b1", 1)]], compile_s=[0.5])
    runner = FakeRunner("r0")
    gate = Gate(DiscardPlan("torch reports h200, not h100"))
    with pytest.raises(DiscardPlan, match="not h100"):
        Pipeline([a, b], [runner], executor=_executor(executor), gate=gate).run()
    assert gate.calls == 1 and runner.calls == []
    assert a.finished == [] and b.finished == [] and a.recorded == [] and b.recorded == []


def test_an_item_with_nothing_to_time_waits_for_the_gate_before_its_entry():
    """A resumed item whose rounds are all journaled writes its entry without a job: the gate comes first."""
    log = []
    done = FakeItem("D", [])
    done.finish = lambda complete: log.append(("finish", complete))
    later = FakeItem("A", [[("a1", 1)]], compile_s=[5.0])
    Pipeline([done, later], [FakeRunner("r0")], executor=SimulatedExecutor(), gate=Gate(log=log)).run()
    assert log[:2] == ["gate", ("finish", True)]
    with pytest.raises(DiscardPlan):
        Pipeline([FakeItem("D", [])], [FakeRunner("r0")], executor=SimulatedExecutor(),
                 gate=Gate(DiscardPlan("no"))).run()


def test_an_error_other_than_discard_still_finishes_started_items_incomplete():
    a = FakeItem("A", [[("a1", 1)]], compile_s=[0.5])
    with pytest.raises(RuntimeError, match="torch broke"):
        Pipeline([a], [FakeRunner("r0")], executor=SimulatedExecutor(), gate=Gate(RuntimeError("torch broke"))).run()
    assert a.finished == [False]


def test_a_slow_gate_holds_the_first_job_not_the_static_phases():
    """Static phases run while the gate waits (torch importing): the compile is not serialised behind it."""
    started = []
    a = FakeItem("A", [[("a1", 1)]])
    b = FakeItem("B", [[("b1", 1)]])
    a.static = lambda: started.append(("A", time.monotonic()))
    b.static = lambda: started.append(("B", time.monotonic()))

    def slow():
        started.append(("gate", time.monotonic()))
        time.sleep(0.3)

    Pipeline([a, b], [FakeRunner("r0")], executor=ThreadExecutor(), compile_slots=2, gate=slow).run()
    names = [n for n, _ in started]
    assert set(names) == {"A", "B", "gate"} and names.index("A") < names.index("gate")
