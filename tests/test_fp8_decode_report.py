"""``rocmflash vgpr-report --mode decode --kv-dtype fp8`` on the CPU: real gfx942 cross-compiles of fp8-cache decode
builds (the report's registers are those of a direct fp8-cache compile, whose ISA widens fp8 with the arch's
conversions), the cache format in the report, and one-line refusals (gfx90a; ``--kv-dtype`` outside decode).
"""

import json
import re

import pytest

from isa_tools import kernel_summary, read_code_object
from rocmflash.kernels.decode import host as KD
from rocmflash.tuning import decode as TD

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
CONFIGS = [dict(BLOCK_N=16, num_warps=4, num_stages=1, waves_per_eu=0, num_splits=0),
           dict(BLOCK_N=32, num_warps=4, num_stages=1, waves_per_eu=0, num_splits=0)]
#: a small problem: D=64, GQA 4 (--heads 8 --kv-heads 2)
SHAPE = ["--head-dim", "64", "--dtype", "bf16", "--heads", "8", "--kv-heads", "2", "--batch", "2", "--seqlen", "256"]
FIELDS = ("vgpr_count", "sgpr_count", "vgpr_spill_count", "waves_per_simd", "lds_bytes")


def _direct(cfg: dict, kv_dtype: str) -> list:
    """(split, combine) summaries and the split kernel's ISA of a direct gfx942 compile, read with isa_tools."""
    kernels = KD.compile_for("gfx942", KD.DecodeConfig.from_dict(cfg), 64, "bf16", group=4, kv_dtype=kv_dtype)
    out = []
    for k in kernels:
        (res,) = read_code_object(k.asm["hsaco"])
        out.append(kernel_summary(res, num_warps=k.metadata.num_warps, asm=k.asm["amdgcn"]))
    return out, kernels[0].asm["amdgcn"]


def test_fp8_cache_decode_report_reads_fp8_builds(tmp_path, monkeypatch, capsys):
    from rocmflash.cli import main

    monkeypatch.setattr(TD, "decode_space", lambda arch: [dict(c) for c in CONFIGS])
    out = tmp_path / "rep"
    code = main(["vgpr-report", "--mode", "decode", "--gpu", "mi300x", "--kv-dtype", "fp8", *SHAPE, "--out", str(out),
                 "--cache-dir", str(tmp_path / "cache"), "--workers", "2", "--json"])
    assert code == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["config"]["BLOCK_N"] for r in rows] == [c["BLOCK_N"] for c in CONFIGS]
    text = (out / "report.md").read_text()  # decode writes report.md only, as for a 16-bit cache
    assert "fp8e4m3fnuz cache" in text and "| BN16 w4 s1" in text  # gfx942's e4m3 is FNUZ
    for row in rows:
        cfg = {k: row["config"][k] for k in CONFIGS[0]}
        (split, combine), asm = _direct(cfg, "fp8e4b8")  # Triton's FNUZ e4m3
        # the fp8-cache build widens fp8 with gfx942's conversion; the report reads that very build
        assert re.search(r"\bv_cvt_pk_f32_fp8", asm)
        assert row["kernel"]["arch"] == "gfx942"
        assert {f: row["kernel"][f] for f in FIELDS} == {f: split[f] for f in FIELDS}, cfg
        assert row["combine"]["vgpr_count"] == combine["vgpr_count"]
    # and a 16-bit cache build of the same config has no fp8 conversions (so the check above can fail)
    _, bf16_asm = _direct(CONFIGS[0], "")
    assert not re.search(r"\bv_cvt_pk_f32_fp8", bf16_asm)


@pytest.mark.parametrize("argv, words", [
    (["--gpu", "mi250", "--mode", "decode", "--kv-dtype", "fp8"], ("gfx90a", "--kv-dtype")),
    (["--gpu", "mi300x", "--kv-dtype", "fp8"], ("--kv-dtype", "--mode prefill")),
    (["--gpu", "mi300x", "--mode", "varlen", "--kv-dtype", "fp8_e5m2"], ("--kv-dtype", "--mode varlen")),
])
def test_kv_dtype_refusals_are_one_line(argv, words, tmp_path, capsys):
    from rocmflash.cli import main

    code = main(["vgpr-report", *argv, "--out", str(tmp_path / "rep"), "--cache-dir", str(tmp_path / "cache")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error:") and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err and all(w in err for w in words), err
    assert not (tmp_path / "rep").exists()  # refused before any compile or write
