"""The fp8 entries shipped in the AMD databases (``configs/mi300x.json``, ``configs/mi355x.json``): static rankings,
labelled unmeasured, keyed by each arch's fp8 format, never served; their register facts are the compiler's.

They come from ``rocmflash tune --dtype fp8`` and ``--mode decode --kv-dtype fp8`` without a live GPU (one process
per GPU: Triton 3.6 keeps one AMD generation's fp8 conversions per process): D=128 at S=4096 (full and
causal) as the shipped bf16 entries, and a decode step of 32 sequences over 8k cached keys, GQA 32:8.
"""

import pytest
import torch

from rocmflash import db as D
from rocmflash.db.lookups import decode as LD
from rocmflash.hw.gpus import get_gpu
from rocmflash.static.space import fp8_format

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
FORMATS = {"mi300x": "fp8e4m3fnuz", "mi355x": "fp8e4m3fn"}


def _entries(gpu: str) -> dict:
    return D.ConfigDB.read(D.shipped_db_path(gpu))["entries"]


@pytest.mark.parametrize("gpu", sorted(FORMATS))
def test_shipped_fp8_entries_load_unmeasured_in_the_arch_format(gpu, tmp_path, monkeypatch):
    from rocmflash.kernels.fp8.forward import check_config

    monkeypatch.setenv(D.CONFIG_DIR_ENV, str(tmp_path))  # an empty user database: the shipped file alone
    D.clear_cache()
    LD.clear_cache()
    fmt = FORMATS[gpu]
    entries = _entries(gpu)
    fwd = {k: e for k, e in entries.items() if k.startswith("d") and f"-{fmt}-" in k}
    assert sorted(fwd) == [f"d128-{fmt}-causal-gqa1-s4096", f"d128-{fmt}-full-gqa1-s4096"]
    for key, entry in fwd.items():
        assert entry["measured"] is False and entry["strategy"] == "static" and entry["note"].startswith("UNMEASURED")
        assert entry["problem"]["fp8_format"] == fp8_format(get_gpu(gpu)) and entry["problem"]["dtype"] == fmt
        assert entry["best"]["variant"] == "online" and set(entry["best_per_variant"]) == {"online"}
        check_config(D.entry_config(entry["best"], get_gpu(gpu).arch))  # what the fp8 kernel runs (BLOCK_N >= 32)
        assert "incumbent" not in entry and entry["seeds"] == []  # no seeds: AMD publishes 16-bit configs
        causal = "-causal-" in key
        dtype = getattr(torch, fp8_format(get_gpu(gpu)))
        assert D.lookup(gpu, 128, dtype, causal, 1, 4096) is not None  # found, and
        assert D.lookup(gpu, 128, dtype, causal, 1, 4096, measured_only=True) is None  # never served
    (key,) = [k for k in entries if k.startswith("decode-") and k.endswith(f"-kv{fmt}")]
    assert key == f"decode-d128-bf16-gqa4-kv8192-b32-kv{fmt}"
    entry = entries[key]
    assert entry["measured"] is False and entry["mode"] == "decode" and entry["best"]["num_splits"] == 0
    assert entry["problem"]["kv_dtype"] == fmt and "no live GPU" in entry["why_unmeasured"]
    assert LD.lookup_decode(gpu, 128, "bf16", 4, 8192, 32, 0, fmt) is None  # unmeasured: never served
    D.clear_cache()
    LD.clear_cache()


def test_no_fp8_entries_for_mi250():
    """gfx90a has no fp8 matrix instructions: its database holds no fp8 entry."""
    assert not [k for k in _entries("mi250") if "fp8" in k]


@pytest.mark.parametrize("gpu", sorted(FORMATS))
def test_shipped_fp8_register_facts_are_the_compilers(gpu, tmp_path):
    """The shipped #1's registers and occupancy, compiled again now for the arch (a sweep's worker process each)."""
    from rocmflash.config import KernelConfig
    from rocmflash.hw.roofline import Shape
    from rocmflash.static.compile import sweep
    from rocmflash.tuning.spec import static_problem

    g = get_gpu(gpu)
    for key in (f"d128-{FORMATS[gpu]}-causal-gqa1-s4096", f"d128-{FORMATS[gpu]}-full-gqa1-s4096"):
        entry = _entries(gpu)[key]
        problem = static_problem(Shape.from_dict(entry["shape"]))
        assert problem.dtype == "fp8"
        (obs,), _ = sweep([KernelConfig.from_dict(entry["best"])], problem, g, cache_dir=str(tmp_path), workers=1)
        assert obs["status"] == "ok", obs["error"]
        k = obs["kernels"][0]
        top = entry["ranked"][0]
        assert top["config"] == entry["best"]
        assert (top["allocated_vgprs"], top["waves_per_simd"]) == (k["allocated_vgprs"], k["waves_per_simd"]), key
