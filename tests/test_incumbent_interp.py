"""The platform's own attention as a candidate: run-time dispatch from a database entry's ``incumbent``
field (forward alone, forward+backward), the cases that always stay on rocmflash's kernels, the backend
list per platform, and the worker task's gate -- in Triton's interpreter (CPU)."""

import math

import pytest
import torch

from rocmflash.api import incumbent
from rocmflash.api import selection
from rocmflash.config import KernelConfig
from rocmflash.kernels.launch import observe_launches
from varlen_reference import attention_fp64, rel_err


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


def _qkv(Sq=64, Sk=64, Hq=4, Hkv=2, D=32, seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)
    ts = [torch.randn(1, h, s, D, generator=g).half() for h, s in ((Hq, Sq), (Hkv, Sk), (Hkv, Sk))]
    return [t.requires_grad_(grad) for t in ts]


def _ref(q, k, v, causal=False):
    o, _ = attention_fp64(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1),
                          1 / math.sqrt(q.shape[-1]), causal)
    return o.transpose(0, 1)[None]


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
    from rocmflash.api.explain import explain

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
