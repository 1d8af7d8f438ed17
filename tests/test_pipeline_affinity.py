"""Jobs whose first run in a process costs more (the incumbent's SDPA timing: cuDNN's and the other backends'
first use, 2-4 s per process on the 2-GPU runs of 2026-11-27) go to a worker that ran one before, so one process
pays it; no worker idles for it (issue #29)."""

from rocmflash.tuning.pipeline_policy import SDPA_AFFINITY, leave_for_another
from test_pipeline import FakeItem, FakeRunner, _intervals, _sim


class IncumbentItem(FakeItem):
    """A FakeItem whose jobs labelled ``inc*`` are incumbent jobs (SDPA affinity)."""

    def next_batch(self):
        batch = super().next_batch()
        for job in batch or ():
            if job.label.startswith("inc"):
                job.affinity = SDPA_AFFINITY
        return batch


def _items(*specs):
    return [IncumbentItem(key, rounds) for key, rounds in specs]


def _worker_of(events, label):
    return next(e["worker"] for e in events if e["event"] == "job_start" and e["label"] == label)


def _start_of(events, label):
    return next(e["t"] for e in events if e["event"] == "job_start" and e["label"] == label)


def test_the_second_incumbent_waits_for_the_worker_that_ran_the_first_while_others_are_ready():
    # t0 w0 a1 (->1), w1 b1 (->3); t1 w0 incA (->2); t2 w0 c1 (->5); t3 incB is ready and w1 free, but w0 ran
    # an incumbent job: w1 takes c2 (->6); t5 w0 takes incB.
    items = _items(("A", [[("a1", 1)], [("incA", 1)]]), ("B", [[("b1", 3)], [("incB", 1)]]),
                   ("C", [[("c1", 3), ("c2", 3), ("c3", 3)]]))
    stats, events = _sim(items, [FakeRunner("r0"), FakeRunner("r1")])
    assert _worker_of(events, "incA") == _worker_of(events, "incB") == "0"
    assert _worker_of(events, "c2") == "1" and _start_of(events, "c2") == 3 and _start_of(events, "incB") == 5
    assert all(it.finished == [True] for it in items) and sum(w.done for w in stats.workers) == 7


def test_no_worker_idles_for_an_incumbent_when_nothing_else_is_ready():
    # w0 runs incA, then d1 (10 s); at t3 incB is ready, w1 is free and nothing else is: w1 takes it at once.
    items = _items(("A", [[("a1", 1)], [("incA", 1)]]), ("B", [[("b1", 3)], [("incB", 1)]]),
                   ("D", [[("d1", 10)]]))
    stats, events = _sim(items, [FakeRunner("r0"), FakeRunner("r1")])
    assert _worker_of(events, "incA") == "0" and _worker_of(events, "incB") == "1"
    assert _start_of(events, "incB") == 3 and stats.wall_s == 12
    busy = _intervals(events)
    assert [(s, e) for s, e, _, _ in busy["1"]] == [(0, 3), (3, 4)]


def test_leave_for_another_is_the_rule_of_one_process_paying():
    ran = {SDPA_AFFINITY: {0}}
    assert leave_for_another(SDPA_AFFINITY, 1, ran, alive=[0, 1])
    assert not leave_for_another(SDPA_AFFINITY, 0, ran, alive=[0, 1])  # it ran one: it takes it
    assert not leave_for_another(SDPA_AFFINITY, 1, ran, alive=[1])  # the worker that ran one is lost
    assert not leave_for_another(SDPA_AFFINITY, 1, {}, alive=[0, 1])  # nobody ran one yet
    assert not leave_for_another(None, 1, ran, alive=[0, 1])  # an ordinary job


def test_the_forward_and_decode_items_incumbent_jobs_carry_the_sdpa_affinity(tmp_path):
    """The real items: the one job that times the platform's SDPA beside a winner (forward and decode) is marked;
    no config's job is."""
    from rocmflash.tuning.decode import DecodeProblem, decode_space
    from rocmflash.tuning.items_decode import DecodeItem
    from rocmflash.tuning.items_fwd import forward_items
    from test_items import SPACE, Recorded, context, fwd_spec

    runner, cache_dir = Recorded(), str(tmp_path / "cache")
    ctx = context(tmp_path / "h100.json", runner)
    problem = DecodeProblem(head_dim=64, dtype="bf16", heads_q=8, heads_kv=2, batch=4, seqlen_k=1024).validate()
    items = forward_items(ctx, fwd_spec(tmp_path / "h100.json", cache_dir, seqlens=[1024], incumbent=True), SPACE)
    items.append(DecodeItem(ctx, problem, cache_dir, 2, 60.0, configs=decode_space("sm_90")[:4]))
    affinities = {}
    for item in items:
        item.static()
        while (batch := item.next_batch()) is not None:
            for job in batch:
                affinities.setdefault((item.family, job.label == "incumbent"), set()).add(job.affinity)
                item.record(job, job.run(runner))
        item.finish(True)
    assert affinities == {("fwd", False): {None}, ("fwd", True): {SDPA_AFFINITY},
                          ("decode", False): {None}, ("decode", True): {SDPA_AFFINITY}}
