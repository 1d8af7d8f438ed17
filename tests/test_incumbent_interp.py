"""The platform's own attention as a candidate: run-time dispatch from a database entry's ``incumbent``
field (forward alone, forward+backward), the cases that always stay on rocmflash's kernels, the backend
list per platform, and the worker task's gate -- in Triton's interpreter (CPU)."""

import pytest
import torch

from rocmflash.api import incumbent
from rocmflash.api import selection
from rocmflash.config import KernelConfig
from rocmflash.kernels.launch import observe_launches
from varlen_reference import bhsd_fp64, bhsd_inputs, rel_err


pytestmark = pytest.mark.usefixtures("fresh_selection")


def _entry_db(tmp_path, monkeypatch, field, causal=False, group=2, D=32, bucket=64):
    db = pytest.importorskip("rocmflash.db")
    monkeypatch.setenv(db.CONFIG_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(db, "shipped_config_dir", lambda: str(tmp_path / "no-shipped"))
    monkeypatch.setattr(selection, "device_identity", lambda device: ("h100", "sm_90"))
    d = db.ConfigDB.open(str(tmp_path / "h100.json"), "h100", "sm_90", {"test": True})
    entry = {"best": KernelConfig(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1).to_dict(), "measured": True}
    if field is not None:
        entry["incumbent"] = field
    d.put(db.problem_key(D, "fp16", causal, group, bucket), entry)
    d.save()


_qkv = bhsd_inputs
_ref = bhsd_fp64


FASTER_FWD = {"backend": "default", "time_ms": 0.1, "triton_ms": 0.2,
              "train": {"backend": "default", "time_ms": 0.9, "triton_ms": 0.5}}


def test_forward_runs_the_incumbent_where_the_entry_says_it_won(interpret, tmp_path, monkeypatch):
    import rocmflash

    _entry_db(tmp_path, monkeypatch, FASTER_FWD)
    q, k, v = _qkv()
    with observe_launches() as seen:
        out = rocmflash.attention(q, k, v)
    assert seen == []  # no rocmflash kernel: SDPA ran
    assert rel_err(out, _ref(q, k, v)) < 1e-2
    assert selection.select_incumbent(q.device, 32, q.dtype, False, 2, 64) == "default"


def test_training_follows_the_forward_backward_times(interpret, tmp_path, monkeypatch):
    """FASTER_FWD: SDPA wins the forward but loses the training step -> a call that needs gradients runs
    rocmflash's forward (and so its backward)."""
    import rocmflash

    _entry_db(tmp_path, monkeypatch, FASTER_FWD)
    q, k, v = _qkv(grad=True)
    with observe_launches() as seen:
        out = rocmflash.attention(q, k, v)
        out.float().sum().backward()
    kernels = [r["kernel"] for r in seen]
    assert any("bwd" in n for n in kernels) and len(kernels) >= 2, kernels
    field = dict(FASTER_FWD, train={"backend": "default", "time_ms": 0.3, "triton_ms": 0.5})
    selection.clear_cache()
    _entry_db(tmp_path, monkeypatch, field)
    q, k, v = _qkv(grad=True, seed=1)
    with observe_launches() as seen:
        out = rocmflash.attention(q, k, v)
        out.float().sum().backward()
    assert seen == [] and q.grad is not None and torch.isfinite(q.grad).all()


@pytest.mark.parametrize("case", ["slower", "lse", "no-field", "explicit-config", "causal-unequal", "decode"])
def test_rocmflash_kernels_where_the_incumbent_does_not_apply_or_lost(interpret, tmp_path, monkeypatch, case):
    import rocmflash

    field = dict(FASTER_FWD, time_ms=0.3) if case == "slower" else (None if case == "no-field" else FASTER_FWD)
    causal = case == "causal-unequal"
    _entry_db(tmp_path, monkeypatch, field, causal=causal, bucket=512 if case == "decode" else 64)
    Sq, Sk = {"causal-unequal": (32, 64), "decode": (1, 512)}.get(case, (64, 64))
    q, k, v = _qkv(Sq=Sq, Sk=Sk)
    kwargs = {"causal": causal}
    if case == "lse":
        kwargs["return_lse"] = True
    if case == "explicit-config":
        kwargs["config"] = KernelConfig(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1)
    with observe_launches() as seen:
        out = rocmflash.attention(q, k, v, **kwargs)
    assert seen, "expected a rocmflash kernel"
    out = out[0] if case == "lse" else out
    assert rel_err(out, _ref(q, k, v, causal)) < 1e-2


def test_patch_sdpa_dispatching_to_the_incumbent_does_not_recurse(interpret, tmp_path, monkeypatch):
    from rocmflash.api import sdpa

    _entry_db(tmp_path, monkeypatch, FASTER_FWD)
    q, k, v = _qkv()
    with sdpa.patch_sdpa(), observe_launches() as seen:
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    assert seen == [] and sdpa.stats()["routed"] >= 1
    assert rel_err(out, _ref(q, k, v)) < 1e-2


def test_backend_lists_per_platform(monkeypatch):
    from rocmflash.hw import platform

    monkeypatch.setattr(platform, "is_rocm", lambda: True)
    assert incumbent.candidates() == ["default", "flash", "efficient"]  # no cuDNN on ROCm
    monkeypatch.setattr(platform, "is_rocm", lambda: False)
    assert incumbent.candidates() == ["default", "flash", "cudnn", "efficient"]


def test_winner_and_field_rules():
    assert incumbent.winner(None, False) is None
    assert incumbent.winner(FASTER_FWD, False) == "default" and incumbent.winner(FASTER_FWD, True) is None
    assert incumbent.winner({"backend": "flash", "time_ms": 1.0, "triton_ms": 1.0}, False) is None  # ties: ours
    result = {"backends": {"default": {"status": "ok", "time_ms": 1.0, "train_ms": 3.0},
                           "flash": {"status": "ok", "time_ms": 0.8, "train_ms": 3.5},
                           "cudnn": {"status": "failed", "error": "no"}}, "triton_train_ms": 3.2}
    field = incumbent.incumbent_field(result, 0.9)
    assert field["backend"] == "flash" and field["time_ms"] == 0.8 and field["triton_ms"] == 0.9
    assert field["train"] == {"backend": "default", "time_ms": 3.0, "triton_ms": 3.2}
    assert field["backends"]["cudnn"]["status"] == "failed"
    assert incumbent.incumbent_field({"backends": {"x": {"status": "failed"}}}, 1.0)["backend"] is None


def test_worker_task_gates_each_backend(interpret):
    """In the interpreter the task gates every backend against the fp32 reference (a backend torch cannot
    run on this device fails cleanly) and times none of them."""
    from rocmflash.hw.roofline import Shape
    from rocmflash.tuning.incumbent_worker import measure
    from rocmflash.tuning.live_worker import LiveSettings

    shape = Shape(batch=1, heads_q=4, heads_kv=2, seqlen_q=64, seqlen_k=64, head_dim=32, dtype="fp16", causal=True)
    task = {"shape": shape.to_dict(), "settings": LiveSettings().to_dict(),
            "config": KernelConfig(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1).to_dict(),
            "backends": ["default", "flash", "cudnn", "efficient"]}
    res = measure(task)
    assert res["status"] == "ok" and set(res["backends"]) == set(task["backends"])
    assert res["backends"]["default"]["status"] == "skipped" and res["backends"]["default"]["rel_err"] < 1e-2
    for r in res["backends"].values():
        assert r["status"] in ("skipped", "failed", "incorrect") and r["time_ms"] is None


def test_far_buckets_and_the_switch_keep_rocmflash(interpret, tmp_path, monkeypatch):
    """An incumbent timed at one length decides for that bucket and the next only; ROCMFLASH_NO_INCUMBENT=1
    turns the dispatch off."""
    import rocmflash

    _entry_db(tmp_path, monkeypatch, FASTER_FWD, bucket=4096)
    dev = torch.device("cpu")
    assert selection.select_incumbent(dev, 32, torch.float16, False, 2, 4096) == "default"
    assert selection.select_incumbent(dev, 32, torch.float16, False, 2, 2048) == "default"  # next bucket
    assert selection.select_incumbent(dev, 32, torch.float16, False, 2, 1024) is None      # two away
    monkeypatch.setenv(selection.NO_INCUMBENT_ENV, "1")
    assert selection.select_incumbent(dev, 32, torch.float16, False, 2, 4096) is None
    q, k, v = _qkv(Sq=64, Sk=64)
    _entry_db(tmp_path, monkeypatch, FASTER_FWD)
    with observe_launches() as seen:
        rocmflash.attention(q, k, v)
    assert seen, "the switch keeps rocmflash's kernel"


def test_explain_says_what_runs_and_why(tmp_path, monkeypatch):
    from rocmflash.cli.explain import explain

    _entry_db(tmp_path, monkeypatch, FASTER_FWD)
    path = str(tmp_path / "h100.json")
    res = explain("h100", 32, "fp16", False, 64, gqa_ratio=2, db_path=path, check=False)
    fwd, train = res["runs"]["forward"], res["runs"]["forward+backward"]
    assert fwd["runs"] == "SDPA (default)" and fwd["sdpa_ms"] == 0.1 and fwd["rocmflash_ms"] == 0.2
    assert train["runs"] == "rocmflash" and train["why"] == "rocmflash was as fast or faster"
    far = explain("h100", 32, "fp16", False, 4096, gqa_ratio=2, db_path=path, check=False)["runs"]["forward"]
    assert far["runs"] == "rocmflash" and "buckets away" in far["why"]
    decode = explain("h100", 32, "fp16", False, 1, seqlen_k=4096, gqa_ratio=2, db_path=path, check=False)
    assert "decode" in decode["runs"]["forward"]["why"]


# ----------------------------------------------------------------------------- the served backend always exists
def test_serving_refusal_per_platform_and_record(monkeypatch):
    """The one check every served incumbent passes: the field's record (else its database's fingerprint) names this
    platform, and this platform offers the backend. Another torch version of the same platform does not refuse."""
    from rocmflash.hw import platform

    cuda = {"platform": "cuda", "torch": "2.11.0+cu130", "cuda": "13.0", "hip": None}
    field = {"backend": "cudnn", "time_ms": 0.1, "triton_ms": 0.2, "timed_on": cuda}
    monkeypatch.setattr(platform, "torch_platform", lambda: "cuda")
    monkeypatch.setattr(platform, "is_rocm", lambda: False)
    assert incumbent.serving_refusal("cudnn", field) is None and incumbent.winner(field, False) == "cudnn"
    assert incumbent.serving_refusal("cudnn", dict(field, timed_on=dict(cuda, torch="2.7.0"))) is None
    assert "rocmflash does not know" in incumbent.serving_refusal("math", field)
    monkeypatch.setattr(platform, "torch_platform", lambda: "hip")
    monkeypatch.setattr(platform, "is_rocm", lambda: True)
    assert "timed on CUDA (its record) and this torch is ROCm" in incumbent.serving_refusal("default", field)
    assert incumbent.winner(field, False) is None and incumbent.winner(field, False, check=False) == "cudnn"
    bare = {k: v for k, v in field.items() if k != "timed_on"}
    assert "its database's fingerprint" in incumbent.serving_refusal("default", bare, "cuda")
    assert "does not offer" in incumbent.serving_refusal("cudnn", bare, None)  # no record, no fingerprint: ROCm's
    assert incumbent.serving_refusal("flash", bare, "hip") is None and incumbent.serving_refusal(None, field) is None
    assert incumbent.decode_winner(dict(field, timing=incumbent.DECODE_TIMING), None)[0] is None


def test_fields_record_what_they_were_timed_on():
    from rocmflash.hw.platform import sdpa_record

    result = {"backends": {"default": {"status": "ok", "time_ms": 1.0}}, "timed_on": {"platform": "hip", "hip": "6.4"}}
    assert incumbent.incumbent_field(result, 2.0)["timed_on"] == {"platform": "hip", "hip": "6.4"}  # the worker's
    mine = incumbent.incumbent_field({"backends": result["backends"]}, 2.0)["timed_on"]
    assert mine == sdpa_record() and mine["torch"] == torch.__version__ and mine["platform"] == "cpu"
    decode = incumbent.decode_field({"status": "ok", "triton_ms": 2.0, **result})
    assert decode["timed_on"] == result["timed_on"] and decode["timing"] == incumbent.DECODE_TIMING


def test_first_call_falls_back_on_a_refusal_only(monkeypatch):
    """A refusal is recorded with one warning; out of memory, a refusal while a CUDA graph captures, and other
    errors propagate and record nothing."""
    import warnings

    from rocmflash.kernels import error_words

    monkeypatch.setattr(incumbent, "_FELL_BACK", {})
    monkeypatch.setattr(incumbent, "_WARNED", set())
    q = torch.randn(1, 2, 4, 8)

    def raising(err):
        def sdpa(*args):
            raise err
        return sdpa

    for err in (torch.OutOfMemoryError("out of memory"), ValueError("not a refusal")):
        with pytest.raises(type(err)):
            incumbent.first_call(raising(err), "flash", False, ("p",), q)
    monkeypatch.setattr(error_words, "capturing", lambda device: True)
    with pytest.raises(RuntimeError, match="No available kernel"):
        incumbent.first_call(raising(RuntimeError("No available kernel")), "flash", False, ("p",), q)
    assert incumbent.sdpa_fallbacks() == {}
    monkeypatch.setattr(error_words, "capturing", lambda device: False)
    with pytest.warns(RuntimeWarning, match="SDPA backend flash raised on the first call of this problem"):
        assert incumbent.first_call(raising(RuntimeError("No available kernel")), "flash", False, ("p", 6), q) is None
    assert incumbent.fell_back("flash", False, ("p", 6)) and not incumbent.fell_back("flash", True, ("p", 6))
    assert not incumbent.fell_back("flash", False, ("p", 7))  # another length bucket: tried on its own
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # ... and not warned of again
        assert incumbent.first_call(raising(RuntimeError("No available kernel")), "flash", False, ("p", 7), q) is None
    assert incumbent.fell_back("flash", False, ("p", 7))
    assert incumbent.first_call(lambda q, x: q + x, "flash", False, ("p", 8), q, 1.0).equal(q + 1.0)


def test_a_training_step_whose_backend_refuses_falls_back_once(interpret, tmp_path, monkeypatch):
    """An entry whose training step SDPA won, where this torch refuses the backend: the first step runs rocmflash's
    forward and backward (gradients right) with one warning; the next step does not try SDPA."""
    import warnings

    import rocmflash

    field = dict(FASTER_FWD, time_ms=0.3, train={"backend": "default", "time_ms": 0.3, "triton_ms": 0.5})
    _entry_db(tmp_path, monkeypatch, field)
    monkeypatch.setattr(incumbent, "_FELL_BACK", {})
    monkeypatch.setattr(incumbent, "_WARNED", set())
    tried = []

    def refusing(*args, **kwargs):
        tried.append(1)
        raise RuntimeError("No available kernel. Aborting execution.")
    monkeypatch.setattr(incumbent, "_SDPA", [refusing])
    for seed in (3, 4):
        q, k, v = _qkv(grad=True, seed=seed)
        dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(seed + 10)).half()
        with warnings.catch_warnings(record=True) as warned, observe_launches() as seen:
            warnings.simplefilter("always")
            out = rocmflash.attention(q, k, v)
            out.backward(dout)
        fell = [w for w in warned if "raised on the first training call" in str(w.message)]
        assert len(fell) == (seed == 3) and any("bwd" in r["kernel"] for r in seen)
        assert rel_err(out, _ref(q, k, v)) < 1e-2
        q64, k64, v64 = (t.detach().double().requires_grad_(True) for t in (q, k, v))
        ref = _ref(q64, k64, v64)
        ref.backward(dout.double())
        assert all(rel_err(t.grad, r.grad) < 2e-2 for t, r in ((q, q64), (k, k64), (v, v64)))
    assert tried == [1]


def test_a_generate_step_whose_backend_refuses_falls_back_to_the_decode_kernel(interpret, monkeypatch):
    """transformers' one-token step served by SDPA (its decode entry said so) where this torch refuses the backend:
    the step runs the decode kernel with one warning, its kept route is dropped, and the next step (one key
    longer) is not given to SDPA again."""
    import warnings

    from rocmflash.integrations import hf

    monkeypatch.setattr(incumbent, "_FELL_BACK", {})
    monkeypatch.setattr(incumbent, "_WARNED", set())
    tried = []

    def refusing(*args, **kwargs):
        tried.append(1)
        raise RuntimeError("No available kernel. Aborting execution.")
    monkeypatch.setattr(incumbent, "_SDPA", [refusing])
    # the decode entry says flash (decode_incumbent), the switch is off, the real ready call
    monkeypatch.setattr(hf, "_INCUMBENT_FNS", [lambda *problem: "flash", lambda: False, incumbent.sdpa_server])
    monkeypatch.setattr(hf, "_KEPT_STEPS", {})
    g = torch.Generator().manual_seed(7)
    q = torch.randn(2, 1, 4, 32, generator=g).half().transpose(1, 2)  # (B, Hq, 1, D) of (B, 1, Hq, D), as HF's
    k, v = (torch.randn(2, 64, 2, 32, generator=g).half().transpose(1, 2) for _ in range(2))
    run = hf._served_step(q, k[:, :, :63], v[:, :, :63], 32 ** -0.5)
    hf._keep_step("step", run)
    with warnings.catch_warnings(record=True) as warned, observe_launches() as seen:
        warnings.simplefilter("always")
        out, _ = run(None, q, k[:, :, :63], v[:, :, :63], None, False, {})
    assert len([w for w in warned if "raised on the first call" in str(w.message)]) == 1
    assert any("decode" in r["kernel"] for r in seen) and hf._KEPT_STEPS == {}
    ref = torch.cat([_ref(q[b:b + 1], k[b:b + 1, :, :63], v[b:b + 1, :, :63]) for b in range(2)])  # (B, Hq, 1, D)
    assert out.shape == (2, 1, 4, 32) and rel_err(out.transpose(1, 2), ref) < 1e-2
    assert hf._served_step(q, k, v, 32 ** -0.5) is None and tried == [1]  # the next step: the decode kernel


def test_the_tunes_pinned_route_raises_where_the_backend_refuses(interpret, monkeypatch):
    """The tune's timing routes pin a side (:meth:`rocmflash.api.ops._Call.pin`): a backend torch refuses must fail
    its gate, never be timed as rocmflash's kernel under its name -- no fallback, nothing recorded."""
    import rocmflash
    from rocmflash.api import ops
    from rocmflash.tuning.incumbent_worker import measure_decode

    monkeypatch.setattr(incumbent, "_FELL_BACK", {})
    monkeypatch.setattr(incumbent, "_WARNED", set())
    q, k, v = _qkv()
    ops._call_plan(q, k, False).pin("cudnn")  # cuDNN has no CPU kernel
    with pytest.raises(RuntimeError):
        rocmflash.attention(q, k, v)
    problem = {"head_dim": 32, "dtype": "fp16", "heads_q": 4, "heads_kv": 2, "batch": 1, "seqlen_k": 300}
    res = measure_decode(problem, None, ["cudnn"])
    assert res["backends"]["cudnn"]["status"] == "failed", res["backends"]
    assert incumbent.sdpa_fallbacks() == {}
