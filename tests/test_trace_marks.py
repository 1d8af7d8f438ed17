"""The tune process's marks in ``$ROCMFLASH_PIPELINE_TRACE`` (where it spends its time outside the pipeline) and
``benchmarks/scale_gpus.py``'s reading of them: on the CPU, through a dry-run model tune."""

import json
import os
import sys

from rocmflash.tuning.output import TRACE_ENV, trace_mark

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_marks_are_written_only_when_traced_and_read_as_offsets(tmp_path, monkeypatch):
    trace = tmp_path / "trace.jsonl"
    monkeypatch.delenv(TRACE_ENV, raising=False)
    trace_mark("nowhere")
    assert not trace.exists()
    monkeypatch.setenv(TRACE_ENV, str(trace))
    from rocmflash.cli import main

    assert main(["tune", "--model", "llama-3-8b", "--gpu", "mi300x", "--dry-run"]) == 0
    events = [json.loads(line) for line in trace.read_text().splitlines()]
    names = [e["name"] for e in events if e["event"] == "mark"]
    assert names == ["cli_main", "model_tune_start", "model_tune_end"]  # a dry run never reaches tune_start
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        import scale_gpus
    finally:
        sys.path.pop(0)
    start = events[0]["wall"] - 1.5
    got = scale_gpus.marks(str(trace), start)
    assert list(got) == names and got["cli_main"] == 1.5 and got["model_tune_end"] >= 1.5
    assert scale_gpus.timeline(str(trace)) == {}  # marks alone: no pipeline events (and no KeyError on "t")
