"""GPU test of `rocmflash tune --mode varlen --pass bwd` end to end (skipped without a CUDA/ROCm GPU in the catalog).

A CLI varlen backward tune on the live GPU gates every dQ and dK/dV static survivor (and the backward served
before: the dense ``bwd-`` entry or per-arch default) on a packed batch against an fp32 reference gradient
and times it; the measured ``varlen-bwd-`` entry is then what ``flash_attn_varlen_func``'s backward launches
in this process, and its gradients match an fp32 reference.
"""

import math

import pytest
import torch

from rocmflash.db import ConfigDB

pytestmark = [pytest.mark.gpu]

KEY = "varlen-bwd-d64-bf16-gqa4-causal-s1024"


def test_varlen_bwd_tune_then_varlen_backward_serves_the_entry(live, compiled, run_cli_tune, monkeypatch):
    import rocmflash
    from rocmflash.api import selection
    from rocmflash.config import KernelConfig
    from rocmflash.kernels.varlen import host as VK
    from rocmflash.tuning.backward import reference_grads
    from rocmflash.tuning.varlen import spread_lengths

    configs = run_cli_tune(["--mode", "varlen", "--pass", "bwd", "--gpu", "auto", "--head-dim", "64", "--dtype", "bf16",
                            "--causal", "--heads", "8", "--kv-heads", "2", "--batch", "8", "--seqlen", "1024"])
    entries = ConfigDB.read(str(configs / f"{live.name}.json"))["entries"]
    assert list(entries) == [KEY], list(entries)  # --pass bwd: no forward entry
    entry = entries[KEY]
    assert entry["mode"] == "varlen" and entry["pass"] == "bwd" and entry["measured"] is True, entry
    assert entry["timing"].startswith("gpu"), entry["timing"]
    counts = entry["counts"]
    assert counts["ok"] >= 0.8 * counts["timed"] and counts["crashed"] == 0, counts
    assert counts["timed"] >= counts["survivors"]
    assert 0.001 < entry["time_ms"]["total"] < 100, entry["time_ms"]  # a GPU time of the packed batch
    base = entry["baseline"]
    assert base["time_ms"]["total"] and entry["time_ms"]["total"] <= base["time_ms"]["total"] * 1.05, base

    monkeypatch.setenv("ROCMFLASH_CONFIG_DIR", str(configs))
    monkeypatch.delenv("ROCMFLASH_NO_DB", raising=False)
    selection.clear_cache()
    launched = []
    for name in ("launch_dq", "launch_dkdv"):
        real = getattr(VK, name)
        monkeypatch.setattr(VK, name, lambda *a, real=real, name=name: launched.append((name, a[-1])) or real(*a))
    lens = list(spread_lengths(8, 1024))
    gen = torch.Generator(device="cuda").manual_seed(13)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    q = torch.randn(sum(lens), 8, 64, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
    k, v = (torch.randn(sum(lens), 2, 64, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
            for _ in range(2))
    do = torch.randn(sum(lens), 8, 64, device="cuda", dtype=torch.bfloat16, generator=gen)
    rocmflash.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True).backward(do)
    best = entry["best"]
    assert launched == [("launch_dq", KernelConfig.from_dict(best["dq"])),
                        ("launch_dkdv", KernelConfig.from_dict(best["dkdv"]))]
    details = selection.varlen_bwd_selection_details(q.device, 64, q.dtype, True, 4, max(lens))
    assert details["source"] == "varlen-db" and details["entry"] == KEY and details["replaced"] == {}, details
    starts = cu.tolist()
    for b in (0, len(lens) - 1):  # the shortest and the longest sequence
        rows = slice(starts[b], starts[b + 1])
        ref = reference_grads(*(t.detach()[rows].transpose(0, 1)[None] for t in (q, k, v, do)), True,
                              1 / math.sqrt(64))
        got = (q.grad[rows, :4].transpose(0, 1), k.grad[rows, 0], v.grad[rows, 0])
        for name, g, want in zip(("dq", "dk", "dv"), got, ref):
            err = ((g.float() - want).norm() / want.norm()).item()
            assert err < 2e-2, (b, name, err)
    selection.clear_cache()
