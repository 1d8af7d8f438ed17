"""The varlen tune times the platform's varlen attention beside its winner (issue #28, item 1): torch's
``torch.nn.attention.varlen.varlen_attn``, in the timing worker, on the same packed batch and fp32 gate, stored as the
entry's ``incumbent`` -- not with ``--no-incumbent``. The worker side runs on the CPU interpreter with a stand-in for
torch's function (it has no CPU kernel); the pipeline side with a fake timing worker and the real gfx90a compile."""

import math

import pytest
import torch

from rocmflash import db as D
from rocmflash.api import varlen_incumbent as VI
from rocmflash.config import KernelConfig as K
from rocmflash.tuning import items_varlen as IV
from rocmflash.tuning import varlen as TV


def _reference_varlen_attn(scale_error=1.0, fail=None):
    """A stand-in for torch's varlen_attn, with its 2.13 signature: fp32 attention per sequence."""
    def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                    window_size=(-1, -1), enable_gqa=False, seqused_k=None, block_table=None, num_splits=None):
        if fail is not None:
            raise fail
        out = torch.empty_like(query)
        group = query.shape[1] // key.shape[1]
        cu = cu_seq_q.tolist()
        for b in range(len(cu) - 1):
            q, k, v = (t[cu[b]:cu[b + 1]].float().transpose(0, 1) for t in (query, key, value))
            k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
            s = q @ k.transpose(1, 2) * (scale or 1 / math.sqrt(query.shape[2])) * scale_error
            if window_size == (-1, 0):
                n = q.shape[1]
                s.masked_fill_(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
            out[cu[b]:cu[b + 1]] = (torch.softmax(s, -1) @ v).transpose(0, 1).to(query.dtype)
        return out
    return varlen_attn


@pytest.fixture
def stand_in(monkeypatch):
    """Put a stand-in in place of torch's varlen_attn (read through rocmflash.hw.platform.varlen_attn)."""
    import inspect

    from rocmflash.hw import platform

    def use(fn):
        monkeypatch.setattr(platform, "_VARLEN_ATTN", [fn, frozenset(inspect.signature(fn).parameters)] if fn else [None, frozenset()])
    yield use


PROBLEM = TV.VarlenProblem(head_dim=32, dtype="fp16", heads_q=4, heads_kv=2, causal=True, lengths=(5, 40, 19))


@pytest.mark.parametrize("causal", [True, False])
def test_worker_gates_and_times_the_platform_varlen_attention(interpret, stand_in, causal):
    from rocmflash.tuning import varlen_worker as W

    stand_in(_reference_varlen_attn())
    W._INPUTS.clear()
    problem = TV.VarlenProblem(head_dim=32, dtype="fp16", heads_q=4, heads_kv=2, causal=causal, lengths=(5, 40, 19))
    config = K(BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=1).to_dict()
    result = W.measure_varlen_incumbent({"problem": problem.to_dict(), "config": config, "reps": 2})
    row = result["backends"][VI.NAME]
    assert result["status"] == "ok" and row["status"] == "ok" and row["rel_err"] < 1e-2 and row["time_ms"] > 0, row
    # one training step each: torch's function (the stand-in is differentiable) and rocmflash's with the winner
    assert row["train_ms"] > 0 and result["triton_train_ms"] > 0, result
    W._INPUTS.clear()


def test_a_function_without_a_backward_keeps_its_forward_time(interpret, stand_in):
    from rocmflash.tuning import varlen_worker as W

    reference = _reference_varlen_attn()

    def forward_only(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, scale=None, window_size=(-1, -1),
                     enable_gqa=False):
        return reference(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, scale=scale, window_size=window_size,
                         enable_gqa=enable_gqa).detach()  # no graph: grad() refuses it

    stand_in(forward_only)
    W._INPUTS.clear()
    row = W.measure_varlen_incumbent({"problem": PROBLEM.to_dict()})["backends"][VI.NAME]
    assert row["status"] == "ok" and row["time_ms"] > 0 and row["train_ms"] is None and row["train_error"], row
    W._INPUTS.clear()


@pytest.mark.parametrize("fn, status, words", [
    (_reference_varlen_attn(scale_error=0.5), "incorrect", "relative error"),
    (_reference_varlen_attn(fail=RuntimeError("FlashAttention only supports Ampere GPUs or newer.")), "failed",
     "Ampere"),
    (None, "skipped", "no torch.nn.attention.varlen.varlen_attn")])
def test_worker_says_why_the_incumbent_has_no_time(interpret, stand_in, fn, status, words):
    from rocmflash.tuning import varlen_worker as W

    stand_in(fn)
    W._INPUTS.clear()
    row = W.measure_varlen_incumbent({"problem": PROBLEM.to_dict()})["backends"][VI.NAME]
    assert row["status"] == status and row["time_ms"] is None and words in row["error"], row
    W._INPUTS.clear()


def test_excludes_reads_the_signature_of_this_torch(stand_in):
    def old_style(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False):
        return query

    stand_in(old_style)  # no enable_gqa, no scale: GQA and other scales have no incumbent on such a torch
    assert VI.excludes(True, True, 1, 64, None) is None
    assert "GQA" in VI.excludes(False, True, 4, 64, None)
    assert "scale" in VI.excludes(False, True, 1, 64, 0.3)
    assert VI.excludes(False, True, 1, 64, 0.125) is None  # 1/sqrt(64) is its own scale
    stand_in(_reference_varlen_attn())
    assert VI.excludes(False, True, 4, 64, 0.3) is None
    assert "separate cu_seqlens" in VI.excludes(True, False, 1, 64, None)
    assert "LSE" in VI.excludes(False, True, 1, 64, None, want_lse=True)
    assert "window" in VI.excludes(False, True, 1, 64, None, windowed=True)


def test_run_passes_the_keywords_this_torch_takes(stand_in):
    seen = []

    def new_style(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, scale=None, window_size=(-1, -1),
                  enable_gqa=False):
        seen.append(dict(scale=scale, window_size=window_size, enable_gqa=enable_gqa))

    def old_style(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False):
        seen.append(dict(is_causal=is_causal))

    q, k, cu = torch.zeros(8, 4, 16), torch.zeros(8, 2, 16), torch.tensor([0, 8], dtype=torch.int32)
    stand_in(new_style)
    VI.run(q, k, k, cu, cu, 8, 8, True, 0.2)
    VI.run(q, q, q, cu, cu, 8, 8, False, None)
    stand_in(old_style)
    VI.run(q, q, q, cu, cu, 8, 8, True, None)
    assert seen == [dict(scale=0.2, window_size=(-1, 0), enable_gqa=True),
                    dict(scale=None, window_size=(-1, -1), enable_gqa=False), dict(is_causal=True)]


# ----------------------------------------------------------------------------- the tune (fake timing worker)
CONFIGS = [K(BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=1, waves_per_eu=2).to_dict(),
           K(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=1, waves_per_eu=2).to_dict()]
INCUMBENT_OK = {"status": "ok", "triton_train_ms": 0.4,
                "backends": {VI.NAME: {"status": "ok", "time_ms": 0.05, "train_ms": 0.5, "rel_err": 1e-3,
                                       "error": None}}}


class FakeRunner:
    """A timing worker running worker tasks: BLOCK_M 64 is the faster config (0.1 ms, the per-arch default
    0.3 ms); the incumbent's task gets ``incumbent``."""

    device = "fake"

    def __init__(self, incumbent=INCUMBENT_OK):
        self.incumbent, self.calls = incumbent, []

    def call(self, fn, task, timeout_s):
        self.calls.append((fn, task))
        if fn is IV.measure_incumbent:
            return dict(self.incumbent)
        ms = {32: 0.2, 64: 0.1}.get(task["config"]["BLOCK_M"], 0.3)
        return {"status": "ok", "config": task["config"], "time_ms": ms, "tflops": 1.0, "rel_err": 1e-3}

    def prewarm_tasks(self, tasks, fn, timeout_s):
        pass

    def incumbent_tasks(self):
        return [task for fn, task in self.calls if fn is IV.measure_incumbent]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("varlen-incumbent-cache"))


def _tune(tmp_path, cache_dir, runner, **kwargs):
    from rocmflash.tuning.varlen_run import tune_varlen

    db_path = str(tmp_path / "mi250.json")
    result = tune_varlen("mi250", PROBLEM, db_path, cache_dir, 2, 120.0, configs=CONFIGS, pool=runner, **kwargs)
    return result, D.ConfigDB.read(db_path)["entries"][PROBLEM.key()]


def test_varlen_tune_stores_the_platform_varlen_attention_beside_the_winner(tmp_path, cache_dir, capsys):
    from rich.console import Console

    from rocmflash.tuning.varlen_run import print_varlen_summary

    runner = FakeRunner()
    result, entry = _tune(tmp_path, cache_dir, runner)
    assert entry["measured"] and entry["best"]["BLOCK_M"] == 64 and entry["time_ms"] == 0.1
    assert runner.calls[-1][0] is IV.measure_incumbent
    assert runner.incumbent_tasks() == [{"problem": PROBLEM.to_dict(), "config": entry["best"]}]
    inc = entry["incumbent"]
    assert inc["backend"] == VI.NAME and inc["time_ms"] == 0.05 and inc["triton_ms"] == 0.1
    assert inc["train"] == {"backend": VI.NAME, "time_ms": 0.5, "triton_ms": 0.4}
    assert inc["backends"][VI.NAME]["status"] == "ok"
    print_varlen_summary(result, Console(width=200))
    assert "platform's varlen attention (varlen_attn): 0.050 ms, 2.00x faster than the winner" in capsys.readouterr().out


def test_no_incumbent_times_and_stores_none(tmp_path, cache_dir):
    runner = FakeRunner()
    _, entry = _tune(tmp_path, cache_dir, runner, incumbent=False)
    assert entry["measured"] and entry["best"] and "incumbent" not in entry
    assert runner.incumbent_tasks() == []


def test_a_refused_incumbent_is_recorded_with_its_reason(tmp_path, cache_dir, capsys):
    from rich.console import Console

    from rocmflash.tuning.varlen_run import print_varlen_summary

    refused = {"status": "ok", "backends": {VI.NAME: {"status": "failed", "time_ms": None, "rel_err": None,
                                                      "error": "RuntimeError: no kernel image"}}}
    result, entry = _tune(tmp_path, cache_dir, FakeRunner(refused))
    assert entry["best"]["BLOCK_M"] == 64 and entry["incumbent"]["backend"] is None
    assert entry["incumbent"]["backends"][VI.NAME]["error"] == "RuntimeError: no kernel image"
    print_varlen_summary(result, Console(width=200))
    assert "platform's varlen attention: not timed (varlen_attn: failed: RuntimeError: no kernel image)" in \
        capsys.readouterr().out


@pytest.mark.parametrize("flag, expected", [([], True), (["--no-incumbent"], False)])
def test_cli_varlen_tune_passes_no_incumbent(flag, expected, tmp_path, monkeypatch):
    from rocmflash.cli import main
    from rocmflash.tuning import varlen_run

    seen = []

    def fake_tune_varlen(*args, incumbent=True, **kwargs):
        seen.append(incumbent)
        raise SystemExit(0)

    monkeypatch.setattr(varlen_run, "tune_varlen", fake_tune_varlen)
    monkeypatch.setenv("ROCMFLASH_CONFIG_DIR", str(tmp_path))
    with pytest.raises(SystemExit):
        main(["tune", "--mode", "varlen", "--gpu", "mi300x", "--head-dim", "128", "--dtype", "bf16", "--seqlen", "4096",
              "--batch", "4", *flag])
    assert seen == [expected]
