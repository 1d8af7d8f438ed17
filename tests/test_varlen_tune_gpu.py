"""GPU test of `rocmflash tune --mode varlen` end to end (skipped without a CUDA/ROCm GPU in the catalog).

A CLI varlen tune on the live GPU gates every static survivor (and the config served before: the dense
entry or per-arch default) on a packed batch and times it; the measured entry is then what
``flash_attn_varlen_func`` launches in this process, and its answer matches an fp32 reference.
"""

import math

import pytest
import torch

from rocmflash.db import ConfigDB

pytestmark = [pytest.mark.gpu]


def _reference(q, k, v, causal: bool):
    """fp32 attention of one sequence, every head: q ``(n, Hq, D)``, k/v ``(n, Hkv, D)`` -> ``(n, Hq, D)``."""
    group = q.shape[1] // k.shape[1]
    qf = q.float().transpose(0, 1)
    kf, vf = (t.float().repeat_interleave(group, 1).transpose(0, 1) for t in (k, v))
    s = qf @ kf.transpose(1, 2) / math.sqrt(q.shape[2])
    if causal:
        n = q.shape[0]
        s.masked_fill_(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return (torch.softmax(s, -1) @ vf).transpose(0, 1)


def test_varlen_tune_then_varlen_serves_the_entry(live, compiled, run_cli_tune, monkeypatch):
    import rocmflash
    from rocmflash.api import selection
    from rocmflash.config import KernelConfig
    from rocmflash.kernels.varlen import host as VK
    from rocmflash.tuning.varlen import spread_lengths

    configs = run_cli_tune(["--mode", "varlen", "--gpu", "auto", "--head-dim", "128", "--dtype", "bf16", "--causal",
                            "--heads", "16", "--kv-heads", "4", "--batch", "8", "--seqlen", "4096"])
    entries = ConfigDB.read(str(configs / f"{live.name}.json"))["entries"]
    assert list(entries) == ["varlen-d128-bf16-gqa4-causal-s4096"], list(entries)
    entry = entries["varlen-d128-bf16-gqa4-causal-s4096"]
    assert entry["mode"] == "varlen" and entry["measured"] is True and entry["timing"].startswith("gpu"), entry
    counts = entry["counts"]
    assert counts["ok"] >= 0.8 * counts["timed"] and counts["crashed"] == 0 and counts["timed"] >= counts["survivors"]
    assert 20 < entry["tflops"] < 2500, entry  # a GPU time of the packed batch, not an interpreter or empty launch
    assert entry["baseline"]["status"] == "ok" and entry["speedup_vs_baseline"] >= 1.0, entry["baseline"]
    # the platform's varlen attention, timed beside the winner on the same packed batch (or why it was not)
    from rocmflash.api import varlen_incumbent as VI
    from rocmflash.hw.platform import varlen_attn

    inc = entry["incumbent"]
    row = inc["backends"][VI.NAME]
    assert inc["triton_ms"] == entry["time_ms"], inc
    fn, names = varlen_attn()
    if fn is None or "enable_gqa" not in names:  # this problem has GQA 4
        assert row["status"] == "skipped" and ("varlen_attn" in row["error"] or "GQA" in row["error"]), row
        assert inc["backend"] is None, inc
    else:
        assert row["status"] in ("ok", "failed"), row  # failed: this torch refused the inputs (the reason is kept)
        if row["status"] == "ok":
            assert row["rel_err"] < 2e-2 and 0 < row["time_ms"] < 100 * entry["time_ms"], row
            assert inc["backend"] == VI.NAME and inc["time_ms"] == round(row["time_ms"], 5), inc
        else:
            assert row["error"] and inc["backend"] is None, inc

    monkeypatch.setenv("ROCMFLASH_CONFIG_DIR", str(configs))
    monkeypatch.delenv("ROCMFLASH_NO_DB", raising=False)
    selection.clear_cache()
    launched = []
    real_launch = VK.launch_forward
    monkeypatch.setattr(VK, "launch_forward", lambda *a: launched.append(a[6]) or real_launch(*a))
    lens = list(spread_lengths(8, 4096))
    gen = torch.Generator(device="cuda").manual_seed(11)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    q = torch.randn(sum(lens), 16, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(sum(lens), 4, 128, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    out = rocmflash.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True)
    assert launched == [KernelConfig.from_dict(entry["best"])]
    details = selection.varlen_selection_details(q.device, 128, q.dtype, True, 4, max(lens))
    assert details["source"] == "varlen-db" and details["entry"] == "varlen-d128-bf16-gqa4-causal-s4096"
    starts = cu.tolist()
    for b in (0, len(lens) - 1):  # the shortest and the longest sequence
        rows = slice(starts[b], starts[b + 1])
        ref = _reference(q[rows], k[rows], v[rows], True)
        assert ((out[rows].float() - ref).norm() / ref.norm()).item() < 2e-2, b
    selection.clear_cache()
