"""The AMD reference set: the shipped file validates, maps onto KernelConfig, and bad files fail clearly."""

import copy
import json
import re

import pytest

from rocmflash.config import KernelConfig, Problem
from rocmflash.static import reference as R


@pytest.fixture(scope="module")
def raw():
    with open(R.DEFAULT_PATH, encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def refs():
    return R.load()


def test_shipped_file_loads_with_provenance(raw, refs):
    assert raw["format"] == R.FORMAT and raw["schema_version"] == R.SCHEMA_VERSION
    assert len(refs) == len(raw["entries"]) >= 40
    assert len({r.id for r in refs}) == len(refs)
    for r in refs:
        assert re.fullmatch(r"[0-9a-f]{40}", r.source.commit), r.id
        assert r.source.url.startswith(f"https://github.com/{r.source.repo}/blob/{r.source.commit}/")
        assert r.source.key and r.kernel and r.notes
    assert {r.source.repo for r in refs} >= {"ROCm/aiter", "ROCm/triton", "ROCm/flash-attention", "vllm-project/vllm"}
    # forward on gfx942 and gfx950 at least, and the backward where the sources give one
    for arch in ("gfx942", "gfx950"):
        assert R.select(refs, arch=arch, pass_="fwd")
        assert R.select(refs, arch=arch, pass_="bwd")


def test_every_rocmflash_config_is_a_kernel_config(raw, refs):
    for entry in raw["entries"]:
        mapped = entry["rocmflash_config"]
        if entry["pass"] == "fwd":
            assert KernelConfig.from_dict(mapped).to_dict()["BLOCK_M"] == entry["config"]["BLOCK_M"]
        else:
            KernelConfig.from_dict(mapped["dkdv"])
            if mapped["dq"] is not None:
                KernelConfig.from_dict(mapped["dq"])
    for r in refs:
        assert (r.rocmflash is None) == (r.pass_ == "bwd")
        assert r.label


def test_aiter_defaults_are_the_published_values(refs):
    """Spot-check the transcription: aiter's gfx942 and gfx950 forward defaults."""
    by_id = {r.id: r for r in refs}
    mi300 = by_id["aiter-gfx942-mha-fwd-default"]
    assert mi300.gpu == "mi300x" and mi300.source.key == "fwd.default"
    assert mi300.config == {"BLOCK_M": 128, "BLOCK_N": 64, "PRELOAD_V": False, "waves_per_eu": 2, "num_warps": 4,
                            "num_ctas": 1, "num_stages": 1}
    assert mi300.rocmflash == KernelConfig(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=1, waves_per_eu=2)
    mi350 = by_id["aiter-gfx950-mha-fwd-default"]
    assert mi350.rocmflash.PRE_LOAD_V is True and mi350.arch == "gfx950"
    onekernel = by_id["aiter-gfx942-mha-bwd-onekernel"]
    assert onekernel.rocmflash_bwd["dkdv"].BLOCK_N == 128 and onekernel.rocmflash_bwd["dq"].BLOCK_M == 128


def test_select_filters(refs):
    d128 = Problem(head_dim=128, dtype="bf16")
    d64 = Problem(head_dim=64, dtype="bf16")
    gfx950 = R.select(refs, arch="gfx950", pass_="fwd")
    small = [r for r in gfx950 if r.id.endswith("small-head")]
    assert small and not R.select(small, problem=d128, strict=False) and R.select(small, problem=d64)
    strict = R.select(refs, arch="gfx942", pass_="fwd", problem=d128)
    assert "aiter-gfx942-mha-fwd-default" in {r.id for r in strict}
    assert all(r.scope.mismatch(d128) is None for r in strict)
    loose = R.select(refs, arch="gfx942", pass_="fwd", problem=d128, strict=False)
    assert len(loose) > len(strict)
    assert {r.gpu for r in R.select(refs, gpu="MI300X")} == {"mi300x"}
    assert all(r.role == "default" for r in R.select(refs, roles=["default"]))
    with pytest.raises(ValueError, match="pass"):
        R.select(refs, pass_="forward")


def test_scope_mismatch_reasons():
    p = Problem(head_dim=128, dtype="fp16", causal=False)
    assert R.Scope().mismatch(p) is None
    assert R.Scope(head_dim_range=(17, 64)).mismatch(p) == "head dim 17..64 only"
    assert R.Scope(dtypes=("bf16",)).mismatch(p) == "bf16 only"
    assert R.Scope(causal=True).mismatch(p) == "causal only"
    assert R.Scope(when="dropout or fp32 inputs").mismatch(p) == "dropout or fp32 inputs"
    assert R.Scope(head_dim=64, dtypes=("fp16",), causal=True).describe() == "D 64, fp16, causal"


def _doc(raw, **changes):
    doc = copy.deepcopy(raw)
    doc["entries"] = doc["entries"][:2]
    for path, value in changes.items():
        target = doc["entries"][0]
        *parents, leaf = path.split("__")
        for p in parents:
            target = target[p]
        if value is KeyError:
            del target[leaf]
        else:
            target[leaf] = value
    return doc


@pytest.mark.parametrize("changes, message", [
    ({"arch": "gfx1100"}, "arch 'gfx1100'"),
    ({"pass": "forward"}, "pass 'forward'"),
    ({"role": "best"}, "role 'best'"),
    ({"notes": KeyError}, "missing key(s) ['notes']"),
    ({"extra": 1}, "unknown key(s) ['extra']"),
    ({"source__commit": "abc123"}, "not a 40-hex commit"),
    ({"source__repo": "aiter"}, "not owner/name"),
    ({"problem__dtypes": ["fp8"]}, "problem.dtypes"),
    ({"problem__head_dim": 300}, "problem.head_dim"),
    ({"problem__head_dim_range": [64, 16]}, "head_dim_range"),
    ({"rocmflash_config__BLOCK_M": 96}, "not a valid KernelConfig: KernelConfig.BLOCK_M=96"),
    ({"rocmflash_config__waves": 2}, "unknown KernelConfig key(s) ['waves']"),
    ({"config": {}}, "'config' must be a non-empty object"),
])
def test_bad_entries_name_the_entry_and_field(raw, changes, message):
    doc = _doc(raw, **changes)
    with pytest.raises(R.ReferenceFileError) as err:
        R.parse(doc, origin="bad.json")
    text = str(err.value)
    assert text.startswith("bad.json: entry #0 (") and message in text, text


def test_bad_documents(raw, tmp_path):
    with pytest.raises(R.ReferenceFileError, match="not found"):
        R.load(str(tmp_path / "missing.json"))
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(R.ReferenceFileError, match="not valid JSON"):
        R.load(str(broken))
    with pytest.raises(R.ReferenceFileError, match="format"):
        R.parse(dict(raw, format="other"))
    with pytest.raises(R.ReferenceFileError, match="schema_version"):
        R.parse(dict(raw, schema_version=2))
    with pytest.raises(R.ReferenceFileError, match="non-empty list"):
        R.parse(dict(raw, entries=[]))
    dup = copy.deepcopy(raw)
    dup["entries"] = [dup["entries"][0], dup["entries"][0]]
    with pytest.raises(R.ReferenceFileError, match="duplicate id"):
        R.parse(dup)
    bwd = next(e for e in raw["entries"] if e["pass"] == "bwd")
    with pytest.raises(R.ReferenceFileError, match="'dkdv' and 'dq'"):
        R.parse(dict(raw, entries=[dict(bwd, rocmflash_config={"dkdv": bwd["rocmflash_config"]["dkdv"]})]))
    assert issubclass(R.ReferenceFileError, ValueError)  # the CLI turns it into one line, exit 2
