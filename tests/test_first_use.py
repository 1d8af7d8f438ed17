"""The first-use decision (``rocmflash.api.first_use``) on the CPU: Triton's interpreter runs rocmflash's side, torch's
CPU SDPA the other, and a stand-in timer says which is faster (it runs each step it times and tells the sides apart
by whether a rocmflash kernel launched). The faster side serves, is kept in memory and in the decisions file, is
not timed again, and nothing is timed while a graph captures, with the switch off, or where an entry decides."""

import functools
import json

import pytest
import torch

from rocmflash.api import first_use, selection
from rocmflash.config import KernelConfig
from rocmflash.kernels.launch import observe_launches
from varlen_reference import bhsd_fp64, bhsd_inputs, rel_err

pytestmark = pytest.mark.usefixtures("fresh_selection", "interpret")


class StandInTimer:
    """``timer(step, n)`` for :func:`first_use.measure`: runs ``step`` once, returns ``ms[side]`` (the side: whether
    a rocmflash kernel launched in it) and counts the calls of each side."""

    def __init__(self, rocmflash_ms: float, sdpa_ms: float):
        self.ms = {"rocmflash": rocmflash_ms, "sdpa": sdpa_ms}
        self.calls = {"rocmflash": 0, "sdpa": 0}
        self.backward = 0  #: timed steps that ran rocmflash's backward kernels

    def __call__(self, step, n):
        with observe_launches() as seen:
            step()
        side = "rocmflash" if seen else "sdpa"
        self.calls[side] += 1
        self.backward += any("bwd" in r["kernel"] for r in seen)
        return self.ms[side]


@pytest.fixture
def on_gpu(monkeypatch, first_use_timing, tmp_path):
    """CPU tensors taken as a live GPU's, the catalog GPU h100, no shipped database; returns the decisions file."""
    from rocmflash import db

    monkeypatch.setattr(first_use, "on_live_gpu", lambda q: True)
    monkeypatch.setattr(selection, "device_identity", lambda device: ("h100", "sm_90"))
    monkeypatch.setattr(db, "shipped_config_dir", lambda: str(tmp_path / "no-shipped"))
    return first_use_timing / "h100.first-use.json"


def _timer(monkeypatch, *times):
    timer = StandInTimer(*times)
    monkeypatch.setattr(first_use, "event_timer", timer)
    return timer


_qkv = functools.partial(bhsd_inputs, Sq=48, Sk=48)  # 48: a length bucket (64) the call does not fill
_ref = bhsd_fp64


def _decisions(path):
    return json.loads(path.read_text())["decisions"]


def test_sdpa_faster_serves_sdpa_records_it_and_never_times_again(on_gpu, monkeypatch):
    import rocmflash

    timer = _timer(monkeypatch, 2.0, 1.0)
    q, k, v = _qkv()
    out = rocmflash.attention(q, k, v, causal=True)
    assert rel_err(out, _ref(q, k, v, True)) < 1e-2
    assert 2 <= timer.calls["rocmflash"] <= 1 + first_use.ROUNDS and timer.calls["sdpa"] == timer.calls["rocmflash"]
    (key, rec), = _decisions(on_gpu).items()
    assert key == "d32-fp16-causal-gqa2-q64-k64-bh4-fwd"
    assert rec["served_by"] == "sdpa" and rec["measured"] == "online" and rec["rocmflash_ms"] == 2.0
    assert rec["shape"] == {"batch": 1, "heads_q": 4, "heads_kv": 2, "seqlen_q": 48, "seqlen_k": 48, "head_dim": 32}
    before = dict(timer.calls)
    q2, k2, v2 = _qkv(seed=1)
    with observe_launches() as seen:
        out2 = rocmflash.attention(q2, k2, v2, causal=True)
    assert seen == [] and timer.calls == before  # SDPA served, nothing timed
    assert rel_err(out2, _ref(q2, k2, v2, True)) < 1e-2


def test_rocmflash_faster_serves_rocmflash(on_gpu, monkeypatch):
    import rocmflash

    timer = _timer(monkeypatch, 1.0, 2.0)
    q, k, v = _qkv()
    out = rocmflash.attention(q, k, v)
    assert rel_err(out, _ref(q, k, v)) < 1e-2
    assert _decisions(on_gpu)["d32-fp16-full-gqa2-q64-k64-bh4-fwd"]["served_by"] == "rocmflash"
    before = dict(timer.calls)
    with observe_launches() as seen:
        rocmflash.attention(*_qkv(seed=2))
    assert seen and timer.calls == before


def test_a_tie_goes_to_sdpa():
    assert first_use.winner(1.0, 1.0) == "sdpa"
    assert first_use.winner(0.985, 1.0) == "sdpa"  # within the margin
    assert first_use.winner(0.97, 1.0) == "rocmflash"


def test_the_decision_persists_across_processes(on_gpu, monkeypatch):
    """A new process (memory forgotten, plans gone) reads the file: served as recorded, not timed."""
    import rocmflash

    _timer(monkeypatch, 2.0, 1.0)
    rocmflash.attention(*_qkv())
    selection.clear_cache()  # every plan and the decisions in memory
    timer = _timer(monkeypatch, 1.0, 2.0)  # would pick rocmflash if it timed again
    with observe_launches() as seen:
        rocmflash.attention(*_qkv(seed=3))
    assert seen == [] and timer.calls == {"rocmflash": 0, "sdpa": 0}


def test_a_record_from_another_environment_is_timed_again(on_gpu, monkeypatch):
    import rocmflash

    _timer(monkeypatch, 2.0, 1.0)
    rocmflash.attention(*_qkv())
    data = json.loads(on_gpu.read_text())
    for rec in data["decisions"].values():
        rec["environment"]["triton"] = "0.0.0"
    on_gpu.write_text(json.dumps(data))
    selection.clear_cache()
    timer = _timer(monkeypatch, 1.0, 2.0)
    with observe_launches() as seen:
        rocmflash.attention(*_qkv(seed=4))
    assert seen and timer.calls["rocmflash"] > 0
    assert _decisions(on_gpu)["d32-fp16-full-gqa2-q64-k64-bh4-fwd"]["served_by"] == "rocmflash"


def test_training_is_decided_apart_and_its_gradients_are_right(on_gpu, monkeypatch):
    """Forward alone and forward+backward are two decisions; the timing's own backward passes leave the caller's
    gradients alone (q.grad is the one backward's, checked against fp64)."""
    import rocmflash

    timer = _timer(monkeypatch, 1.0, 2.0)
    q, k, v = _qkv(grad=True)
    out = rocmflash.attention(q, k, v, causal=True)
    assert timer.calls["rocmflash"] > 0 and timer.backward == timer.calls["rocmflash"]  # whole training steps
    g = torch.randn_like(out)
    out.backward(g)
    qr, kr, vr = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = _ref(qr, kr, vr, True)
    ref.backward(g.double())
    for got, want in ((q.grad, qr.grad), (k.grad, kr.grad), (v.grad, vr.grad)):
        assert rel_err(got, want) < 2e-2
    decisions = _decisions(on_gpu)
    assert list(decisions) == ["d32-fp16-causal-gqa2-q64-k64-bh4-train"]
    with torch.no_grad():  # the forward alone is its own decision: timed now
        rocmflash.attention(*_qkv(seed=5), causal=True)
    assert sorted(_decisions(on_gpu)) == ["d32-fp16-causal-gqa2-q64-k64-bh4-fwd",
                                          "d32-fp16-causal-gqa2-q64-k64-bh4-train"]


def test_never_timed_while_a_graph_captures(on_gpu, monkeypatch):
    import rocmflash

    timer = _timer(monkeypatch, 1.0, 2.0)
    monkeypatch.setattr(first_use, "capturing", lambda q: True)
    q, k, v = _qkv()
    with observe_launches() as seen:
        out = rocmflash.attention(q, k, v)
    assert seen == [] and timer.calls == {"rocmflash": 0, "sdpa": 0}  # SDPA served, nothing timed
    assert rel_err(out, _ref(q, k, v)) < 1e-2 and not on_gpu.exists()
    monkeypatch.setattr(first_use, "capturing", lambda q: False)
    rocmflash.attention(q, k, v)  # the first eager call decides
    assert timer.calls["rocmflash"] > 0 and on_gpu.exists()


@pytest.mark.parametrize("env", [("ROCMFLASH_FIRST_USE_TIMING", "0"), ("ROCMFLASH_NO_INCUMBENT", "1")])
def test_switches_turn_it_off(on_gpu, monkeypatch, env):
    import rocmflash

    monkeypatch.setenv(*env)
    timer = _timer(monkeypatch, 2.0, 1.0)
    with observe_launches() as seen:
        rocmflash.attention(*_qkv())
    assert seen and timer.calls == {"rocmflash": 0, "sdpa": 0} and not on_gpu.exists()


def test_a_measured_entry_decides_instead(on_gpu, monkeypatch, tmp_path):
    """An entry with the incumbent timed (both sides) decides; first use times nothing."""
    import rocmflash
    from rocmflash import db

    d = db.ConfigDB.open(str(on_gpu.parent / "h100.json"), "h100", "sm_90", {"test": True})
    d.put(db.problem_key(32, "fp16", False, 2, 64),
          {"best": KernelConfig(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1).to_dict(), "measured": True,
           "incumbent": {"backend": "default", "time_ms": 0.2, "triton_ms": 0.1,
                         "train": {"backend": "default", "time_ms": 0.9, "triton_ms": 0.5}}})
    d.save()
    timer = _timer(monkeypatch, 2.0, 1.0)
    with observe_launches() as seen:
        rocmflash.attention(*_qkv())
    assert seen and timer.calls == {"rocmflash": 0, "sdpa": 0}


def test_a_malformed_decisions_file_is_never_overwritten(on_gpu, monkeypatch):
    import rocmflash

    on_gpu.parent.mkdir(parents=True, exist_ok=True)
    on_gpu.write_text("{not json")
    timer = _timer(monkeypatch, 2.0, 1.0)
    with pytest.warns(RuntimeWarning, match="first-use decisions file of h100 is not used"):
        rocmflash.attention(*_qkv())
    assert on_gpu.read_text() == "{not json"
    before = dict(timer.calls)
    with observe_launches() as seen:  # kept in memory all the same
        rocmflash.attention(*_qkv(seed=6))
    assert seen == [] and timer.calls == before


def test_an_sdpa_refusal_serves_rocmflash(on_gpu, monkeypatch):
    import rocmflash

    def refuse(backend, causal, gqa):
        def call(q, k, v, scale):
            raise RuntimeError("No available kernel. Aborting execution.")
        return call if backend else None
    monkeypatch.setattr("rocmflash.api.ops.sdpa_server", refuse)
    _timer(monkeypatch, 2.0, 1.0)
    q, k, v = _qkv()
    with observe_launches() as seen:
        out = rocmflash.attention(q, k, v)
    assert seen and rel_err(out, _ref(q, k, v)) < 1e-2
    rec = _decisions(on_gpu)["d32-fp16-full-gqa2-q64-k64-bh4-fwd"]
    assert rec["served_by"] == "rocmflash" and rec["why"].startswith("SDPA refused: RuntimeError: No available kernel")


def test_flash_attn_func_and_patch_sdpa_take_the_same_decision(on_gpu, monkeypatch):
    """One decision per problem, whichever entry point made it (flash-attn's layout included)."""
    import rocmflash

    timer = _timer(monkeypatch, 2.0, 1.0)
    q, k, v = _qkv()
    rocmflash.attention(q, k, v)
    before = dict(timer.calls)
    qs, ks, vs = (t.transpose(1, 2).contiguous() for t in _qkv(seed=7))
    with observe_launches() as seen:
        out = rocmflash.flash_attn_func(qs, ks, vs)
        with rocmflash.patch_sdpa():
            out2 = torch.nn.functional.scaled_dot_product_attention(qs.transpose(1, 2), ks.transpose(1, 2),
                                                                    vs.transpose(1, 2), enable_gqa=True)
    assert seen == [] and timer.calls == before
    ref = _ref(qs.transpose(1, 2), ks.transpose(1, 2), vs.transpose(1, 2))
    assert rel_err(out.transpose(1, 2), ref) < 1e-2 and rel_err(out2, ref) < 1e-2


def test_the_cost_is_bounded():
    """At most 2 + ROUNDS * MAX_REPEAT calls of each side for a tiny call, 2 + ROUNDS for a 1 ms one."""
    for ms, most in ((0.001, 2 + first_use.ROUNDS * first_use.MAX_REPEAT), (1.5, 2 + first_use.ROUNDS)):
        count = {"a": 0, "b": 0}

        def step(name):
            def run():
                count[name] += 1
            return run

        def timer(run, n):
            for _ in range(n):
                run()
            return ms
        first_use.measure({"a": step("a"), "b": step("b")}, timer)
        assert count == {"a": most, "b": most}


def test_decision_key_buckets():
    key = first_use.decision_key(128, torch.bfloat16, True, 7, 2, 28, 8000, 8192, True)
    assert key == "d128-bf16-causal-gqa7-q8192-k8192-bh64-train"


def test_explain_shows_the_first_use_decision(on_gpu, monkeypatch, capsys):
    """``rocmflash explain`` on the asked problem: before its first use, that it is not timed yet; after, the
    recorded side and both times (CLI end to end, in-process)."""
    import rocmflash
    from rocmflash.cli import main

    argv = ["explain", "--gpu", "h100", "--head-dim", "32", "--dtype", "fp16", "--seqlen", "48", "--gqa", "2",
            "--batch", "1", "--heads", "4", "--no-compile"]
    assert main(argv) == 0
    assert "first use (d32-fp16-full-gqa2-q64-k64-bh4-fwd): not timed yet" in capsys.readouterr().out
    _timer(monkeypatch, 2.0, 1.0)
    rocmflash.attention(*_qkv())
    assert main(argv) == 0
    text = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    assert "forward runs: SDPA (default) (first-use times: SDPA default 1.0 ms vs rocmflash 2.0 ms)" in text
    assert main(argv + ["--json"]) == 0
    fwd = json.loads(capsys.readouterr().out)["runs"]["forward"]
    assert fwd["first_use"]["record"]["served_by"] == "sdpa" and fwd["runs"] == "SDPA (default)"


def test_timing_out_of_memory_serves_sdpa_records_nothing(on_gpu, monkeypatch):
    import rocmflash

    def no_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    monkeypatch.setattr(first_use, "decide", no_memory)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    q, k, v = _qkv()
    with pytest.warns(RuntimeWarning, match="ran out of GPU memory"), observe_launches() as seen:
        out = rocmflash.attention(q, k, v)
    assert seen == [] and rel_err(out, _ref(q, k, v)) < 1e-2 and not on_gpu.exists()


def test_a_decode_shaped_call_without_a_decode_entry_is_timed_too(on_gpu, monkeypatch):
    """One query token over many keys and no ``decode-`` entry: the first call times the decode kernel against
    SDPA (forward only); a call that needs gradients is not timed (no SDPA side for it, as before)."""
    import rocmflash

    timer = _timer(monkeypatch, 2.0, 1.0)
    q, k, v = _qkv(Sq=1, Sk=512, Hq=8, Hkv=2)
    out = rocmflash.attention(q, k, v, causal=True)
    assert rel_err(out, _ref(q, k, v, True)) < 1e-2 and timer.calls["rocmflash"] > 0
    assert list(_decisions(on_gpu)) == ["d32-fp16-causal-gqa4-q1-k512-bh8-fwd"]
    before = dict(timer.calls)
    with observe_launches() as seen:
        rocmflash.attention(*_qkv(Sq=1, Sk=512, Hq=8, Hkv=2, seed=8), causal=True)
    assert seen == [] and timer.calls == before
    qg, kg, vg = _qkv(Sq=1, Sk=512, Hq=8, Hkv=2, seed=9, grad=True)
    with observe_launches() as seen:
        rocmflash.attention(qg, kg, vg, causal=True).float().sum().backward()
    assert seen and timer.calls == before and qg.grad is not None
