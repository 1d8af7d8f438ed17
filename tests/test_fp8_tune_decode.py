"""``rocmflash tune --mode decode --kv-dtype fp8`` on the CPU: the cache format in the problem and its key, a whole
decode tune of an fp8 cache on a (fake) MI300X (gfx942 builds, interpreter timing), the static entry of a GPU
without a live device, and ``flash_attn_with_kvcache`` serving the entry of its cache's format only.
"""

import pytest
import torch

from rocmflash import db as D
from rocmflash.db.lookups import decode as LD
from rocmflash.hw.gpus import get_gpu
from rocmflash.kernels.decode import host as KD
from rocmflash.tuning import decode as TD

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
MI300X = {"name": "AMD Instinct MI300X", "gcn_arch_name": "gfx942:sramecc+:xnack-", "multi_processor_count": 304,
          "total_memory": 192 * 1024**3}
CONFIGS = [dict(BLOCK_N=16, num_warps=4, num_stages=1, waves_per_eu=2, num_splits=0),
           dict(BLOCK_N=32, num_warps=4, num_stages=1, waves_per_eu=2, num_splits=0)]


@pytest.mark.parametrize("gpu, kv, key", [
    ("mi300x", "fp8", "decode-d128-bf16-gqa4-kv8192-b32-kvfp8e4m3fnuz"),
    ("mi300x", "fp8_e5m2", "decode-d128-bf16-gqa4-kv8192-b32-kvfp8e5m2fnuz"),
    ("mi355x", "fp8_e4m3", "decode-d128-bf16-gqa4-kv8192-b32-kvfp8e4m3fn"),
    ("h100", "fp8", "decode-d128-bf16-gqa4-kv8192-b32-kvfp8e4m3fn"),
    ("h100", "auto", "decode-d128-bf16-gqa4-kv8192-b32"),
])
def test_kv_dtype_resolves_to_the_arch_format_in_the_key(gpu, kv, key):
    problem = TD.DecodeProblem(seqlen_k=8192, kv_dtype=kv).validate().for_gpu(get_gpu(gpu))
    assert problem.key() == key
    parsed = LD.parse_decode_key(key)
    assert parsed.get("kv_dtype", "") == problem.kv_dtype and parsed["kv_bucket"] == 8192
    paged = LD.parse_decode_key(TD.decode_key(128, "bf16", 4, 8192, 32, 256, problem.kv_dtype))
    assert paged["page_size"] == 256 and paged["batch_bucket"] == 32 and paged.get("kv_dtype", "") == problem.kv_dtype
    if problem.kv_dtype:  # an fp8 cache: one byte an element read
        assert problem.kv_bytes() * 2 == TD.DecodeProblem(seqlen_k=8192).kv_bytes()
        assert problem.to_dict()["kv_dtype"] == problem.kv_dtype
    else:  # a 16-bit problem's dict (its compile-cache and journal key) is what it was before fp8 caches
        assert "kv_dtype" not in problem.to_dict()


def test_kv_dtype_errors_name_the_arch():
    with pytest.raises(ValueError, match=r"mi250 \(gfx90a\) has no fp8"):
        TD.DecodeProblem(kv_dtype="fp8").validate().for_gpu(get_gpu("mi250"))
    with pytest.raises(ValueError, match="gfx942 computes in FNUZ"):
        TD.DecodeProblem(kv_dtype="float8_e4m3fn").validate().for_gpu(get_gpu("mi300x"))
    with pytest.raises(ValueError, match="expected auto, fp8, fp8_e4m3 or fp8_e5m2"):
        TD.DecodeProblem(kv_dtype="int8").validate()


@pytest.mark.parametrize("fake_rocm", [MI300X], indirect=True)
def test_fp8_kv_decode_tune_on_a_fake_mi300x_end_to_end(fake_rocm, tmp_path):
    """Every survivor gated against the dequantised cache and timed at each split count; the fp8 entry and the 16-bit
    cache's entry of the same problem coexist."""
    from rocmflash.tuning.decode_run import tune_decode

    db_path, cache = str(tmp_path / "mi300x.json"), str(tmp_path / "cache")
    problem = TD.DecodeProblem(head_dim=32, dtype="bf16", heads_q=4, heads_kv=2, batch=2, seqlen_k=64, kv_dtype="fp8")
    result = tune_decode("mi300x", problem.validate(), db_path, cache, 2, 120.0, configs=CONFIGS)
    assert result.measured and result.key == "decode-d32-bf16-gqa2-kv64-b2-kvfp8e4m3fnuz"
    assert [r["status"] for r in result.results] == ["ok"] * len(result.static.ranked) == ["ok", "ok"]
    plain = tune_decode("mi300x", TD.DecodeProblem(head_dim=32, dtype="bf16", heads_q=4, heads_kv=2, batch=2,
                                                   seqlen_k=64), db_path, cache, 2, 120.0, configs=CONFIGS)
    entries = D.ConfigDB.read(db_path)["entries"]
    assert set(entries) == {result.key, plain.key} and plain.key == "decode-d32-bf16-gqa2-kv64-b2"
    entry = entries[result.key]
    assert entry["measured"] and entry["timing"] == "interpreter" and entry["problem"]["kv_dtype"] == "fp8e4m3fnuz"
    assert entry["best"]["num_splits"] >= 1
    assert result.problem.kv_bytes() == 2 * 2 * 64 * 2 * 32 == plain.problem.kv_bytes() // 2  # K/V read: 1 byte each
    journal = D.Journal(D.journal_path(db_path), "mi300x").records
    assert {r["shape"].get("kv_dtype") for r in journal} == {"fp8e4m3fnuz", None}
    # the decode kernels were built for gfx942 with the FNUZ cache type (and the 16-bit cache's apart)
    from isa_tools import iter_kernels

    from rocmflash.static.compile import triton_cache_dir

    built = [k for k, _ in iter_kernels([triton_cache_dir(cache)])]
    assert {k.arch for k in built} == {"gfx942"}
    assert sum("split" in k.name for k in built) == 2 * len(CONFIGS)  # one split kernel per config and cache format


def test_static_fp8_kv_decode_tune_without_a_gpu(tmp_path, monkeypatch, capsys):
    """The CLI path of the shipped AMD entries: no live GPU, the static #1 written unmeasured under the OCP key."""
    from rocmflash.cli import main

    monkeypatch.setattr(TD, "decode_space", lambda arch: [dict(c, waves_per_eu=0) for c in CONFIGS])
    db_path = tmp_path / "mi355x.json"
    code = main(["tune", "--mode", "decode", "--gpu", "mi355x", "--kv-dtype", "fp8", "--head-dim", "64", "--dtype",
                 "bf16", "--seqlen", "4096", "--batch", "8", "--db", str(db_path), "--cache-dir",
                 str(tmp_path / "cache"), "--workers", "2"])
    out = capsys.readouterr().out
    assert code == 0, out
    entry = D.ConfigDB.read(str(db_path))["entries"]["decode-d64-bf16-gqa4-kv4096-b8-kvfp8e4m3fn"]
    assert entry["measured"] is False and entry["best"]["num_splits"] == 0 and entry["mode"] == "decode"
    assert entry["counts"]["space"] == 2 and entry["problem"]["kv_dtype"] == "fp8e4m3fn"


@pytest.mark.parametrize("fake_rocm", [MI300X], indirect=True)
def test_kvcache_serves_the_entry_of_its_cache_format(fake_rocm, tmp_path, monkeypatch):
    import rocmflash
    from rocmflash.api import decode as Dm
    from rocmflash.api import selection
    from rocmflash.kernels.launch import observe_launches

    fp8_cfg = dict(BLOCK_N=32, num_warps=2, num_stages=1, waves_per_eu=3, num_splits=1)
    bf16_cfg = dict(BLOCK_N=32, num_warps=4, num_stages=1, waves_per_eu=1, num_splits=1)
    monkeypatch.setenv(D.CONFIG_DIR_ENV, str(tmp_path))
    monkeypatch.delenv(selection.NO_DB_ENV, raising=False)
    store = D.ConfigDB.open(str(tmp_path / "mi300x.json"), "mi300x", "gfx942", D.environment("AMD Instinct MI300X"))
    for key, cfg in (("decode-d64-bf16-gqa2-kv512-b2-kvfp8e4m3fnuz", fp8_cfg), ("decode-d64-bf16-gqa2-kv512-b2",
                                                                                bf16_cfg)):
        store.put(key, {"mode": "decode", "best": cfg, "measured": True, "time_ms": 0.01})
    store.save()
    selection.clear_cache()
    Dm.clear_cache()
    cpu = torch.device("cpu")
    want8, want16 = KD.DecodeConfig.from_dict(fp8_cfg), KD.DecodeConfig.from_dict(bf16_cfg)
    assert Dm.decode_config(cpu, 64, torch.bfloat16, 2, 512, 2, 0, torch.float8_e4m3fnuz) == want8
    assert Dm.decode_config(cpu, 64, torch.bfloat16, 2, 512, 2, 0, False) == want16
    assert LD.lookup_decode("mi300x", 64, "bf16", 2, 512, 2, 0, "fp8e4m3fn") is None  # the other family: never

    gen = torch.Generator().manual_seed(1)
    q = torch.randn(2, 1, 4, 64, dtype=torch.bfloat16, generator=gen)
    k16, v16 = (torch.randn(2, 512, 2, 64, dtype=torch.bfloat16, generator=gen) for _ in range(2))
    lens = torch.full((2,), 500, dtype=torch.int32)
    ks = vs = torch.full((2, 2), 0.02)
    k8, v8 = ((x.float() / 0.02).to(torch.float8_e4m3fnuz) for x in (k16, v16))
    for (kc, vc, extra), options in (((k8, v8, dict(k_descale=ks, v_descale=vs)), (2, 3)),
                                     ((k16, v16, {}), (4, 1))):
        with observe_launches() as launches:
            out = rocmflash.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, **extra)
        assert torch.isfinite(out).all()
        split = [rec for rec in launches if "split" in rec["kernel"]]
        assert split and (split[0]["options"]["num_warps"], split[0]["options"]["waves_per_eu"]) == options
    Dm.clear_cache()
