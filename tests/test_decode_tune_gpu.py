"""GPU test of `rocmflash tune --mode decode` end to end (skipped without a CUDA/ROCm GPU in the catalog).

A CLI decode tune on the live GPU gates every survivor and times it as a server runs decode (graph
replay over cold K/V copies); the measured entry is then what ``flash_attn_with_kvcache`` serves in
this process, and its answer matches an fp32 reference.
"""

import math

import pytest
import torch

from rocmflash.db import ConfigDB

pytestmark = [pytest.mark.gpu]


def test_decode_tune_then_decode_serves_the_entry(live, run_cli_tune, monkeypatch):
    import rocmflash
    from rocmflash.api import decode
    from rocmflash.kernels.decode.host import DecodeConfig

    configs = run_cli_tune(["--mode", "decode", "--gpu", "auto", "--head-dim", "128", "--dtype", "bf16",
                            "--heads", "32", "--kv-heads", "4", "--seqlen", "8192", "--batch", "4"])
    entries = ConfigDB.read(str(configs / f"{live.name}.json"))["entries"]
    (key, entry), = [(k, e) for k, e in entries.items() if k.startswith("decode-")]
    assert entry["measured"] and entry["timing"].startswith("gpu graph replay"), entry
    assert entry["counts"]["ok"] >= 0.8 * entry["counts"]["timed"] and entry["counts"]["crashed"] == 0
    assert 0.05 < entry["hbm_efficiency"] < 1.1, entry  # a graph-replayed time over cold caches, not L2 hits
    monkeypatch.setenv("ROCMFLASH_CONFIG_DIR", str(configs))
    monkeypatch.delenv("ROCMFLASH_NO_DB", raising=False)
    decode.clear_cache()
    want = DecodeConfig.from_dict(entry["best"])
    assert decode.decode_config(torch.device("cuda"), 128, torch.bfloat16, 8, 8192, 4) == want
    gen = torch.Generator(device="cuda").manual_seed(5)
    q = torch.randn(4, 1, 32, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    kc, vc = (torch.randn(4, 8192, 4, 128, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    out = rocmflash.flash_attn_with_kvcache(q, kc, vc)
    k = kc[0].float().repeat_interleave(8, 1)
    v = vc[0].float().repeat_interleave(8, 1)
    p = torch.softmax(torch.einsum("hd,khd->hk", q[0, 0].float(), k) / math.sqrt(128), -1)
    ref = torch.einsum("hk,khd->hd", p, v)
    assert ((out[0, 0].float() - ref).norm() / ref.norm()).item() < 2e-2
    decode.clear_cache()
