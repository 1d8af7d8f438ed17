"""GPU test of `rocmflash tune --pass both` end to end (skipped without a CUDA/ROCm GPU in the catalog).

A CLI tune on the live GPU writes a measured forward entry and a measured ``bwd-`` entry (every
dQ and dK/dV survivor gated against the fp32 reference gradient and timed); then, in this process,
the autograd backward of ``rocmflash.attention`` selects that entry (not the per-arch default) and
its gradients match an fp32 reference.
"""

import math

import pytest
import torch

from rocmflash.db import ConfigDB

pytestmark = [pytest.mark.gpu]


def test_tune_both_passes_then_training_uses_the_backward_entry(live, run_cli_tune, monkeypatch):
    import rocmflash
    from rocmflash.api import selection
    from rocmflash.tuning.backward import reference_grads

    configs = run_cli_tune(["--gpu", "auto", "--pass", "both", "--head-dim", "64", "--dtype", "bf16", "--causal",
                            "--seqlen", "1024", "--batch", "2", "--heads", "8", "--kv-heads", "2",
                            "--variant", "online", "--strategy", "pruned", "--top-k", "4",
                            "--no-incumbent"])  # this test is about rocmflash's backward being served
    entries = ConfigDB.read(str(configs / f"{live.name}.json"))["entries"]
    fwd, bwd = entries["d64-bf16-causal-gqa4-s1024"], entries["bwd-d64-bf16-causal-gqa4-s1024"]
    assert fwd["measured"] and bwd["measured"] and bwd["timing"] == "gpu"
    counts = bwd["counts"]
    assert counts["ok"] >= 0.8 * counts["timed"] and counts["crashed"] == 0, counts
    assert bwd["time_ms"]["total"] <= bwd["default_time_ms"]["total"] * 1.05  # the default was timed too
    # training in this process: the tuned backward entry is what autograd runs
    monkeypatch.setenv("ROCMFLASH_CONFIG_DIR", str(configs))
    monkeypatch.delenv("ROCMFLASH_NO_DB", raising=False)
    selection.clear_cache()
    gen = torch.Generator(device="cuda").manual_seed(7)
    q = torch.randn(2, 8, 1024, 64, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
    k, v = (torch.randn(2, 2, 1024, 64, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
            for _ in range(2))
    do = torch.randn(2, 8, 1024, 64, device="cuda", dtype=torch.bfloat16, generator=gen)
    rocmflash.attention(q, k, v, causal=True).backward(do)
    details = selection.bwd_selection_details(q.device, 64, q.dtype, True, 4, 1024)
    assert details["source"] == "db" and details["entry"] == "bwd-d64-bf16-causal-gqa4-s1024", details
    ref = reference_grads(q.detach(), k.detach(), v.detach(), do, True, 1 / math.sqrt(64))
    for got, want in zip((q.grad[0, :4], k.grad[0, 0], v.grad[0, 0]), ref):
        err = ((got.float() - want).norm() / want.norm()).item()
        assert err < 1e-2, err
    selection.clear_cache()
