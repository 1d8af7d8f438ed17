"""GPU tests of ``rocmflash tune --dtype fp8`` and ``--mode decode --kv-dtype fp8`` (skipped without a live GPU in the
catalog that has fp8 matrix instructions: sm_89+, gfx942, gfx950).

Each runs the CLI tune on the live GPU in a child process (``run_cli_tune``: its own database and compile cache),
then checks the measured entry and that the public API serves it in this process: ``rocmflash.attention`` with fp8
q/k/v of the GPU's format, ``flash_attn_with_kvcache`` with an fp8 cache, each against fp32 attention of the
dequantised inputs. About 3 minutes on an H100 (the fp8 forward's 36-config NVIDIA space and the decode space
compiled on the host's cores, a pruned forward of 6 configs, every decode survivor timed).
"""

import math

import pytest
import torch

from rocmflash.db import ConfigDB, key_dtype
from rocmflash.hw.fp8 import FAMILY_DTYPES, fp8_family

pytestmark = [pytest.mark.gpu]


@pytest.fixture
def fp8_dtype(live):
    family = fp8_family(live.arch)
    if family is None:
        pytest.skip(f"{live.name} ({live.arch}) has no fp8 matrix instructions")
    return FAMILY_DTYPES[family][0]


def _serve_from(configs, monkeypatch):
    from rocmflash.api import selection

    monkeypatch.setenv("ROCMFLASH_CONFIG_DIR", str(configs))
    monkeypatch.delenv("ROCMFLASH_NO_DB", raising=False)
    selection.clear_cache()


def test_fp8_tune_then_attention_serves_the_entry(live, fp8_dtype, run_cli_tune, monkeypatch):
    import rocmflash
    from rocmflash.api.selection_fp8 import fp8_selection_details
    from rocmflash.hw.fp8 import unit_roundoff
    from rocmflash.tuning import live_fp8

    configs = run_cli_tune(["--gpu", "auto", "--dtype", "fp8", "--head-dim", "128", "--seqlen", "4096", "--causal",
                            "--strategy", "pruned", "--top-k", "6"])
    key = f"d128-{key_dtype(fp8_dtype)}-causal-gqa1-s4096"
    entries = ConfigDB.read(str(configs / f"{live.name}.json"))["entries"]
    assert list(entries) == [key], list(entries)
    entry = entries[key]
    assert entry["measured"] and entry.get("timing") != "interpreter" and entry["complete"], entry
    assert entry["counts"]["ok"] >= 4 and entry["counts"]["crashed"] == 0, entry["counts"]
    assert "incumbent" not in entry and entry["tflops"] > 0 and 0 < entry["efficiency"] < 1.1
    print(f"\n{key}: {entry['tflops']} TFLOP/s ({100 * entry['efficiency']:.0f}% of the fp8 roofline), "
          f"{entry['best']}")
    _serve_from(configs, monkeypatch)
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(2)
    q, k, v = (live_fp8.fill(torch.empty(4, 16, 4096, 128, device=dev, dtype=fp8_dtype), gen) for _ in range(3))
    qd, kd, vd = live_fp8.descales(4, 16, fp8_dtype, dev, gen)
    out = rocmflash.attention(q, k, v, causal=True, q_descale=qd, k_descale=kd, v_descale=vd)
    details = fp8_selection_details(dev, 128, fp8_dtype, True, 1, 4096)
    assert details["source"] == "db" and details["entry"] == key, details
    # one (batch, head) against fp32 attention of the dequantised inputs: the fp8 bound (relative L2 <= u)
    qf, kf, vf = (live_fp8.dequantised(x[:1, :1], d[:1, :1]) for x, d in ((q, qd), (k, kd), (v, vd)))
    s = (qf[0, 0] @ kf[0, 0].T) / math.sqrt(128)
    mask = torch.ones(4096, 4096, device=dev, dtype=torch.bool).triu(1)  # causal, Sq == Sk
    ref = torch.softmax(s.masked_fill(mask, float("-inf")), -1) @ vf[0, 0]
    err = ((out[0, 0].float() - ref).norm() / ref.norm()).item()
    assert err <= unit_roundoff(fp8_dtype), err


def test_fp8_kv_decode_tune_then_kvcache_serves_the_entry(live, fp8_dtype, run_cli_tune, monkeypatch):
    import rocmflash
    from rocmflash.api import decode
    from rocmflash.kernels.decode.host import DecodeConfig
    from rocmflash.tuning import live_fp8

    configs = run_cli_tune(["--mode", "decode", "--gpu", "auto", "--kv-dtype", "fp8", "--head-dim", "128", "--dtype",
                            "bf16", "--heads", "32", "--kv-heads", "8", "--seqlen", "8192", "--batch", "8"])
    key = f"decode-d128-bf16-gqa4-kv8192-b8-kv{key_dtype(fp8_dtype)}"
    entries = ConfigDB.read(str(configs / f"{live.name}.json"))["entries"]
    assert list(entries) == [key], list(entries)
    entry = entries[key]
    assert entry["measured"] and entry["timing"].startswith("gpu graph replay"), entry
    assert entry["counts"]["ok"] >= 0.8 * entry["counts"]["timed"] and entry["counts"]["crashed"] == 0
    assert 0.05 < entry["hbm_efficiency"] < 1.1, entry  # one byte an element read, at most the HBM's peak
    print(f"\n{key}: {entry['time_ms'] * 1e3:.1f} us, {entry['kv_gbs']} GB/s ({100 * entry['hbm_efficiency']:.0f}% "
          f"of HBM), {entry['best']}")
    _serve_from(configs, monkeypatch)
    decode.clear_cache()
    dev = torch.device("cuda")
    assert decode.decode_config(dev, 128, torch.bfloat16, 4, 8192, 8, 0, fp8_dtype) == DecodeConfig.from_dict(
        entry["best"])
    gen = torch.Generator(device=dev).manual_seed(4)
    q = torch.randn(8, 1, 32, 128, device=dev, dtype=torch.bfloat16, generator=gen)
    k8, v8 = (live_fp8.fill(torch.empty(8, 8192, 8, 128, device=dev, dtype=fp8_dtype), gen) for _ in range(2))
    ks, vs, _ = live_fp8.descales(8, 8, fp8_dtype, dev, gen)  # the cache holds k / k_descale
    out = rocmflash.flash_attn_with_kvcache(q, k8, v8, k_descale=ks, v_descale=vs)
    k = (k8[0].float() * ks[0][None, :, None]).repeat_interleave(4, 1)
    v = (v8[0].float() * vs[0][None, :, None]).repeat_interleave(4, 1)
    p = torch.softmax(torch.einsum("hd,khd->hk", q[0, 0].float(), k) / math.sqrt(128), -1)
    ref = torch.einsum("hk,khd->hd", p, v)
    assert ((out[0, 0].float() - ref).norm() / ref.norm()).item() < 2e-2
    decode.clear_cache()
