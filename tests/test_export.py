"""``rocmflash export`` for a user's ``@triton.autotune`` (issue 47 item 6): every family in its own section with
the problem fields it was tuned for, a label that says measured only for what a GPU timed, failed problems never
exported as configs, the device in both headers, and Python that imports and runs with the installed Triton."""

import json
import os
import re

import pytest

from rocmflash import db as D
from rocmflash.cli import main
from rocmflash.config import KernelConfig

triton = pytest.importorskip("triton")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FINGERPRINT = {"rocmflash": "0.1.0", "triton": "3.6.0", "torch": "2.9.0+rocm7.0", "runtime": "hip 7.0",
               "device": "AMD Instinct MI300X"}
GPU_TIMED = {"measured": True, "timing": "gpu", "fingerprint": FINGERPRINT, "when": "2026-11-20T10:00:00Z"}
STATIC = {"measured": False, "strategy": "static", "why_unmeasured": "no live GPU on this machine",
          "fingerprint": FINGERPRINT}


def _cfg(**kw) -> dict:
    return KernelConfig(**kw).to_dict()


#: one entry per case of the issue, each config different so a mixed-up mapping shows
AMD_ENTRIES = {
    # forward, timed on the GPU; a schedule hint is an AMD option of its own
    "d128-bf16-causal-gqa1-s2048": dict(GPU_TIMED, tflops=412.5, best=_cfg(
        BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=1, waves_per_eu=2, matrix_instr_nonkdim=16, kpack=2,
        schedule_hint="attention")),
    "d128-bf16-causal-gqa1-s8192": dict(GPU_TIMED, tflops=380.0, best=_cfg(
        BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2, waves_per_eu=1, matrix_instr_nonkdim=32, PRE_LOAD_V=True)),
    "d128-bf16-full-gqa1-s2048": dict(STATIC, best=_cfg(BLOCK_M=128, BLOCK_N=32, num_warps=4, num_stages=1)),
    "d64-fp16-full-gqa2-s1024": dict(GPU_TIMED, timing="interpreter", tflops=0.01,  # a CPU interpreter's time
                                     best=_cfg(BLOCK_M=32, BLOCK_N=32, num_warps=2, num_stages=1)),
    # split_kv won; the online row of best_per_variant is what a triton.Config can carry
    "d128-fp16-causal-gqa1-s4096": dict(GPU_TIMED, tflops=300.0, best=_cfg(
        BLOCK_M=64, BLOCK_N=128, num_warps=4, num_stages=1, variant="split_kv", num_splits=4),
        best_per_variant={"online": {"config": _cfg(BLOCK_M=256, BLOCK_N=32, num_warps=8, num_stages=1,
                                                    waves_per_eu=3), "tflops": 250.0}}),
    "d256-bf16-full-gqa1-s4096": dict(GPU_TIMED, tflops=200.0, best=_cfg(BLOCK_M=64, BLOCK_N=64, num_warps=4,
                                                                        num_stages=1, variant="split_d")),
    "decode-d128-bf16-gqa4-kv8192-b32": dict(GPU_TIMED, mode="decode", time_ms=0.0512, timing="gpu graph replay",
                                             best={"BLOCK_N": 32, "num_warps": 4, "num_stages": 1, "waves_per_eu": 2,
                                                   "num_splits": 8}),
    "decode-d64-bf16-gqa8-kv4096-b16-p256": dict(STATIC, mode="decode", best={"BLOCK_N": 64, "num_warps": 8,
                                                                            "num_stages": 2}),
    "varlen-d128-bf16-gqa4-causal-s4096": dict(GPU_TIMED, mode="varlen", tflops=280.0, best=_cfg(
        BLOCK_M=128, BLOCK_N=32, num_warps=4, num_stages=1, waves_per_eu=2, matrix_instr_nonkdim=16)),
    "bwd-d128-bf16-causal-gqa1-s4096": dict(GPU_TIMED, mode="bwd", time_ms={"dq": 1.25, "dkdv": 2.5, "total": 3.75},
                                            best={"dq": _cfg(BLOCK_M=128, BLOCK_N=32, num_warps=8, num_stages=1),
                                                  "dkdv": _cfg(BLOCK_M=32, BLOCK_N=128, num_warps=4, num_stages=2,
                                                               waves_per_eu=1),
                                                  "head_splits": 2}),
    "varlen-bwd-d64-fp16-gqa2-s2048": dict(STATIC, mode="varlen", best={
        "dq": _cfg(BLOCK_M=64, BLOCK_N=16, num_warps=4, num_stages=1),
        "dkdv": _cfg(BLOCK_M=16, BLOCK_N=64, num_warps=4, num_stages=1, matrix_instr_nonkdim=16), "head_splits": 0}),
    # problems whose tune found no config: never exported as configs
    "d128-bf16-full-gqa1-s16384": {"measured": False, "best": None,
                                   "failed": "every config failed (4 timed: 4 crashed)"},
    "decode-d128-fp16-gqa1-kv1024-b1": {"measured": True, "mode": "decode", "best": None,
                                        "note": "no timed config passed"},
}
#: what each exported key must be labelled (False: not timed on a GPU)
AMD_MEASURED = {"d128-bf16-causal-gqa1-s2048": True, "d128-bf16-causal-gqa1-s8192": True,
                "d128-bf16-full-gqa1-s2048": False, "d64-fp16-full-gqa2-s1024": False,
                "d128-fp16-causal-gqa1-s4096": True, "decode-d128-bf16-gqa4-kv8192-b32": True,
                "decode-d64-bf16-gqa8-kv4096-b16-p256": False, "varlen-d128-bf16-gqa4-causal-s4096": True,
                "bwd-d128-bf16-causal-gqa1-s4096": True, "varlen-bwd-d64-fp16-gqa2-s2048": False}
FAILED = ("d128-bf16-full-gqa1-s16384", "decode-d128-fp16-gqa1-kv1024-b1")


def _write_db(path, gpu: str, arch: str, entries: dict) -> str:
    data = D.ConfigDB.new_data(gpu, arch, FINGERPRINT)
    data["entries"] = entries
    D.atomic_write_json(str(path), data)
    return str(path)


@pytest.fixture
def amd_db(tmp_path, monkeypatch):
    monkeypatch.setenv(D.CONFIG_DIR_ENV, str(tmp_path / "none"))  # no user database gets in the way
    return _write_db(tmp_path / "mi300x.json", "mi300x", "gfx942", AMD_ENTRIES)


def _export(capsys, *argv) -> str:
    assert main(["export", *argv]) == 0
    captured = capsys.readouterr()
    assert captured.err == "", captured.err
    return captured.out


def _exec(text: str) -> dict:
    namespace: dict = {}
    exec(compile(text, "<rocmflash export>", "exec"), namespace)
    return namespace


# ---------------------------------------------------------------------- what a config must carry
def _amd_kwargs(cfg: dict, tile: tuple, options=("waves_per_eu", "matrix_instr_nonkdim", "kpack")) -> dict:
    """The kwargs a triton.Config of ``cfg`` must hold on AMD (written out here, not taken from the export)."""
    full = {"waves_per_eu": 0, "matrix_instr_nonkdim": 0, "kpack": 1, "schedule_hint": "none", **cfg}
    out = {name: full[name] for name in tile + options}
    if full["schedule_hint"] != "none":
        out["schedule_hint"] = full["schedule_hint"]
    return out


def _expected_configs() -> dict:
    """``{python dict name: {key: (kwargs, num_warps, num_stages)}}`` of the AMD database above."""
    fwd, bwd = ("BLOCK_M", "BLOCK_N", "PRE_LOAD_V"), ("BLOCK_M", "BLOCK_N")
    out: dict = {name: {} for name in ("CONFIGS", "DECODE_CONFIGS", "VARLEN_CONFIGS", "BWD_DQ_CONFIGS",
                                       "BWD_DKDV_CONFIGS", "VARLEN_BWD_DQ_CONFIGS", "VARLEN_BWD_DKDV_CONFIGS")}

    def put(name, key, cfg, kwargs):
        out[name][key] = (kwargs, cfg["num_warps"], cfg["num_stages"])

    for key, e in AMD_ENTRIES.items():
        if not e.get("best") or key == "d256-bf16-full-gqa1-s4096":  # no config / no online config
            continue
        if key.startswith("decode-"):
            put("DECODE_CONFIGS", key, e["best"], {"BLOCK_N": e["best"]["BLOCK_N"],
                                                   "waves_per_eu": e["best"].get("waves_per_eu", 0)})
        elif key.startswith(("bwd-", "varlen-bwd-")):
            stem = "BWD" if key.startswith("bwd-") else "VARLEN_BWD"
            for kernel in ("dq", "dkdv"):
                put(f"{stem}_{kernel.upper()}_CONFIGS", key, e["best"][kernel], _amd_kwargs(e["best"][kernel], bwd))
        else:
            cfg = e["best"] if e["best"]["variant"] == "online" else e["best_per_variant"]["online"]["config"]
            put("VARLEN_CONFIGS" if key.startswith("varlen-") else "CONFIGS", key, cfg, _amd_kwargs(cfg, fwd))
    return out


# ---------------------------------------------------------------------- the Python output
def test_triton_output_execs_with_every_family_and_its_amd_options(amd_db, capsys):
    text = _export(capsys, "--gpu", "mi300x", "--db", amd_db)
    ns = _exec(text)
    for name, expected in _expected_configs().items():
        got = ns[name]
        assert sorted(got) == sorted(expected), name
        for key, (kwargs, warps, stages) in expected.items():
            cfg = got[key]
            assert isinstance(cfg, triton.Config), (name, key)
            assert (cfg.kwargs, cfg.num_warps, cfg.num_stages) == (kwargs, warps, stages), (name, key)
        # the distinct list holds each config once, in the per-key dict's order
        distinct = ns[name.replace("CONFIGS", "AUTOTUNE_CONFIGS")]
        assert [str(c) for c in distinct] == list(dict.fromkeys(str(c) for c in got.values())), name
    assert ns["DECODE_NUM_SPLITS"] == {"decode-d128-bf16-gqa4-kv8192-b32": 8, "decode-d64-bf16-gqa8-kv4096-b16-p256": 0}
    assert ns["BWD_HEAD_SPLITS"] == {"bwd-d128-bf16-causal-gqa1-s4096": 2}
    assert ns["VARLEN_BWD_HEAD_SPLITS"] == {"varlen-bwd-d64-fp16-gqa2-s2048": 0}


def test_triton_output_problem_fields_and_autotune_keys(amd_db, capsys):
    ns = _exec(_export(capsys, "--gpu", "mi300x", "--db", amd_db))
    assert ns["FORWARD_KEY"] == ns["BWD_KEY"] == ["HEAD_DIM", "IS_CAUSAL", "GQA_RATIO", "N_CTX"]
    assert ns["VARLEN_KEY"] == ns["VARLEN_BWD_KEY"] == ["HEAD_DIM", "IS_CAUSAL", "GQA_RATIO", "MAX_SEQLEN"]
    assert ns["DECODE_KEY"] == ["HEAD_DIM", "GQA_RATIO", "N_CTX_K", "BATCH", "PAGE_SIZE"]
    assert ns["FORWARD_PROBLEMS"]["d128-fp16-causal-gqa1-s4096"] == {
        "HEAD_DIM": 128, "DTYPE": "fp16", "IS_CAUSAL": True, "GQA_RATIO": 1, "N_CTX": 4096}
    assert ns["DECODE_PROBLEMS"]["decode-d64-bf16-gqa8-kv4096-b16-p256"] == {
        "HEAD_DIM": 64, "DTYPE": "bf16", "KV_DTYPE": "bf16", "GQA_RATIO": 8, "N_CTX_K": 4096, "BATCH": 16,
        "PAGE_SIZE": 256}
    assert ns["VARLEN_PROBLEMS"]["varlen-d128-bf16-gqa4-causal-s4096"] == {
        "HEAD_DIM": 128, "DTYPE": "bf16", "IS_CAUSAL": True, "GQA_RATIO": 4, "MAX_SEQLEN": 4096}
    assert ns["BWD_PROBLEMS"]["bwd-d128-bf16-causal-gqa1-s4096"]["N_CTX"] == 4096
    assert ns["VARLEN_BWD_PROBLEMS"]["varlen-bwd-d64-fp16-gqa2-s2048"]["IS_CAUSAL"] is False
    for stem in ("FORWARD", "DECODE", "VARLEN", "BWD", "VARLEN_BWD"):  # a field of each key's problem, every key
        configs = ns["CONFIGS"] if stem == "FORWARD" else ns.get(f"{stem}_CONFIGS", ns.get(f"{stem}_DQ_CONFIGS"))
        assert sorted(ns[f"{stem}_PROBLEMS"]) == sorted(configs)
        assert all(set(ns[f"{stem}_KEY"]) <= set(fields) for fields in ns[f"{stem}_PROBLEMS"].values())


def test_triton_output_labels_measured_only_what_a_gpu_timed(amd_db, capsys):
    text = _export(capsys, "--gpu", "mi300x", "--db", amd_db)
    ns = _exec(text)
    assert ns["MEASURED"] == AMD_MEASURED
    comments = {}  # every config line's comment, per key (a backward has one line per kernel)
    for key, comment in re.findall(r"^    '([^']+)': triton\.Config\(.*\),  # (.*)$", text, re.M):
        comments.setdefault(key, []).append(comment)
    assert sorted(comments) == sorted(AMD_MEASURED)
    for key, measured in AMD_MEASURED.items():
        for comment in comments[key]:
            assert comment.startswith("measured") is measured, (key, comment)
            assert ("UNMEASURED" in comment) is (not measured), (key, comment)
    assert comments["d128-bf16-full-gqa1-s2048"] == ["UNMEASURED: static ranking"]
    assert comments["d64-fp16-full-gqa2-s1024"] == ["UNMEASURED: timed in the CPU interpreter, not on a GPU"]
    assert comments["d128-bf16-causal-gqa1-s2048"] == ["measured, 412.5 TFLOP/s"]
    assert comments["d128-fp16-causal-gqa1-s4096"] == [
        "measured, 250.0 TFLOP/s, the best online config; split_kv was faster"]
    assert comments["bwd-d128-bf16-causal-gqa1-s4096"] == ["measured, dq 1.25 ms of 3.75 ms",
                                                           "measured, dkdv 2.5 ms of 3.75 ms"]


def test_triton_output_never_exports_a_failed_problem(amd_db, capsys):
    text = _export(capsys, "--gpu", "mi300x", "--db", amd_db)
    ns = _exec(text)
    every_config_key = {key for name, value in ns.items() if name.endswith("_CONFIGS") or name == "CONFIGS"
                        if isinstance(value, dict) for key in value}
    assert not every_config_key & {*FAILED, "d256-bf16-full-gqa1-s4096"}
    assert sorted(ns["NOT_EXPORTED"]) == sorted([*FAILED, "d256-bf16-full-gqa1-s4096"])
    assert ns["NOT_EXPORTED"]["d128-bf16-full-gqa1-s16384"] == "failed: every config failed (4 timed: 4 crashed)"
    assert ns["NOT_EXPORTED"]["decode-d128-fp16-gqa1-kv1024-b1"] == \
        "no config (best is null: a tune found none; no timed config passed)"
    assert "'split_d'" in ns["NOT_EXPORTED"]["d256-bf16-full-gqa1-s4096"]
    for key in FAILED:  # named once, in NOT_EXPORTED (nowhere as a config or a problem)
        assert text.count(repr(key)) == 1, key


def test_triton_header_names_the_device_and_fingerprint(amd_db, capsys):
    text = _export(capsys, "--gpu", "mi300x", "--db", amd_db)
    first, second = text.splitlines()[:2]
    assert first == "# rocmflash export: mi300x (gfx942); device AMD Instinct MI300X, triton 3.6.0, torch 2.9.0+rocm7.0"
    assert second.startswith("# AMD Instinct MI300X; database fingerprint: rocmflash 0.1.0, runtime hip 7.0; updated ")


# ---------------------------------------------------------------------- JSON
def test_json_every_family_its_fields_label_and_header(amd_db, capsys):
    out = json.loads(_export(capsys, "--gpu", "mi300x", "--db", amd_db, "--format", "json"))
    assert out["format"] == "rocmflash-export" and out["gpu"] == "mi300x" and out["arch"] == "gfx942"
    assert out["fingerprint"] == FINGERPRINT
    assert out["device"] == {"gpu": "mi300x", "marketing_name": "AMD Instinct MI300X", "arch": "gfx942",
                             "name": "AMD Instinct MI300X", "rocmflash": "0.1.0", "triton": "3.6.0",
                             "torch": "2.9.0+rocm7.0", "runtime": "hip 7.0"}
    families = out["families"]
    assert list(families) == ["forward", "decode", "varlen", "bwd", "varlen-bwd"]
    assert out["entries"] == families["forward"]["entries"]  # the forward's, under the key they always had
    got = {key: item for fam in families.values() for key, item in fam["entries"].items()}
    assert sorted(got) == sorted([*AMD_MEASURED, "d256-bf16-full-gqa1-s4096"])
    assert {key: item["measured"] for key, item in got.items()} == {**AMD_MEASURED, "d256-bf16-full-gqa1-s4096": True}
    assert got["d64-fp16-full-gqa2-s1024"]["status"] == "interpreter"
    assert got["d128-bf16-full-gqa1-s2048"]["status"] == "static"
    assert got["d128-bf16-full-gqa1-s2048"]["label"] == "UNMEASURED: static ranking"
    assert got["d128-bf16-full-gqa1-s2048"]["why_unmeasured"] == "no live GPU on this machine"
    for name, expected in _expected_configs().items():  # the same configs as the Python output
        for key, (kwargs, warps, stages) in expected.items():
            tc = got[key]["triton_config"]
            tc = tc[name.split("_")[-2].lower()] if "_DQ_" in name or "_DKDV_" in name else tc
            assert tc == {"kwargs": kwargs, "num_warps": warps, "num_stages": stages}, (name, key)
    assert "no online config" in got["d256-bf16-full-gqa1-s4096"]["no_triton_config"]
    assert got["decode-d128-bf16-gqa4-kv8192-b32"]["num_splits"] == 8
    assert got["bwd-d128-bf16-causal-gqa1-s4096"]["head_splits"] == 2
    assert got["decode-d128-bf16-gqa4-kv8192-b32"]["fields"]["N_CTX_K"] == 8192
    assert families["decode"]["key"] == ["HEAD_DIM", "GQA_RATIO", "N_CTX_K", "BATCH", "PAGE_SIZE"]
    assert families["varlen-bwd"]["measured"] is False and families["bwd"]["measured"] is True
    assert sorted(out["not_exported"]) == sorted(FAILED)
    assert out["not_exported"]["d128-bf16-full-gqa1-s16384"].startswith("failed: ")


def test_json_measured_is_false_for_a_database_no_gpu_timed(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(D.CONFIG_DIR_ENV, str(tmp_path / "none"))
    interpreted = {key: dict(e, timing="interpreter") for key, e in AMD_ENTRIES.items() if e.get("measured")}
    path = _write_db(tmp_path / "mi300x.json", "mi300x", "gfx942", interpreted)
    out = json.loads(_export(capsys, "--gpu", "mi300x", "--db", path, "--format", "json"))
    assert out["measured"] is False
    assert not any(item["measured"] for fam in out["families"].values() for item in fam["entries"].values())
    assert not any(fam["measured"] for fam in out["families"].values())
    ns = _exec(_export(capsys, "--gpu", "mi300x", "--db", path))
    assert ns["MEASURED"] and not any(ns["MEASURED"].values())


# ---------------------------------------------------------------------- the helpers, under a real @triton.autotune
H100_FP = dict(FINGERPRINT, torch="2.11.0+cu130", runtime="cuda 13.0", device="NVIDIA H100 80GB HBM3")
H100_ENTRIES = {
    "d64-bf16-causal-gqa1-s2048": dict(GPU_TIMED, fingerprint=H100_FP, tflops=300.0,
                                       best=_cfg(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3)),
    "d64-bf16-causal-gqa1-s8192": dict(GPU_TIMED, fingerprint=H100_FP, tflops=350.0,
                                       best=_cfg(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2, PRE_LOAD_V=True)),
    "d64-fp16-causal-gqa1-s2048": dict(STATIC, best=_cfg(BLOCK_M=32, BLOCK_N=16, num_warps=2, num_stages=1)),
}


@pytest.fixture
def h100_export(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(D.CONFIG_DIR_ENV, str(tmp_path / "none"))
    path = _write_db(tmp_path / "h100.json", "h100", "sm_90", H100_ENTRIES)
    return _exec(_export(capsys, "--gpu", "h100", "--db", path))


def test_tuned_config_picks_the_nearest_measured_bucket(h100_export):
    import torch

    ns = h100_export
    pick = lambda **p: ns["tuned_config"](ns["CONFIGS"], ns["FORWARD_PROBLEMS"], **p)  # noqa: E731
    base = dict(HEAD_DIM=64, DTYPE=torch.bfloat16, IS_CAUSAL=True, GQA_RATIO=1)
    assert pick(**base, N_CTX=1500) is ns["CONFIGS"]["d64-bf16-causal-gqa1-s2048"]
    assert pick(**base, N_CTX=3000) is ns["CONFIGS"]["d64-bf16-causal-gqa1-s8192"]  # 4096: a tie, the larger wins
    assert pick(**base, N_CTX=100000) is ns["CONFIGS"]["d64-bf16-causal-gqa1-s8192"]
    assert pick(**dict(base, IS_CAUSAL=False), N_CTX=2048) is None  # no entry of that problem
    fp16 = dict(base, DTYPE=torch.float16, N_CTX=2048)
    assert pick(**fp16) is None  # a static guess only: not picked
    assert ns["tuned_config"](ns["CONFIGS"], ns["FORWARD_PROBLEMS"], False, **fp16) is \
        ns["CONFIGS"]["d64-fp16-causal-gqa1-s2048"]
    with pytest.raises(TypeError, match="give exactly the fields"):
        pick(HEAD_DIM=64, N_CTX=2048)


def test_prune_to_tuned_under_triton_autotune(h100_export, interpret):
    """The exported lists and prune helper drive a real ``triton.autotune`` (Triton's interpreter, its timer
    stubbed: the interpreter has none): the tuned config runs without timing any other; an untuned problem
    times them all."""
    import torch
    import triton.language as tl

    ns, timed = h100_export, []

    def do_bench(kernel_call, quantiles):
        timed.append(1)
        kernel_call()
        return [1.0, 1.0, 1.0]

    @triton.autotune(configs=ns["AUTOTUNE_CONFIGS"], key=ns["FORWARD_KEY"], do_bench=do_bench,
                     prune_configs_by={"early_config_prune": ns["prune_to_tuned"](
                         ns["CONFIGS"], ns["FORWARD_PROBLEMS"], DTYPE="Q", GQA_RATIO=1)})
    @triton.jit
    def probe(Q, Out, N_CTX, HEAD_DIM: tl.constexpr, IS_CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, PRE_LOAD_V: tl.constexpr):
        i = tl.arange(0, 4)
        q = tl.load(Q + i).to(tl.float32)
        tl.store(Out + i, q + tl.where(i == 0, BLOCK_M, tl.where(i == 1, BLOCK_N, tl.where(i == 2, PRE_LOAD_V, 0))))

    for dtype, n_ctx, key in ((torch.bfloat16, 8000, "d64-bf16-causal-gqa1-s8192"),
                              (torch.bfloat16, 1024, "d64-bf16-causal-gqa1-s2048"), (torch.float16, 2048, None)):
        timed.clear()
        q = torch.randn(4, dtype=dtype)
        out = torch.full((4,), float("nan"))
        probe[(1,)](q, out, n_ctx, HEAD_DIM=64, IS_CAUSAL=True)
        if key is None:  # static entries only: Triton times every config, as without the helper
            assert len(timed) == len(ns["AUTOTUNE_CONFIGS"])
            continue
        cfg = ns["CONFIGS"][key]
        assert len(timed) == 1 and probe.best_config.kwargs == cfg.kwargs
        ran = (out - q.float()).tolist()
        assert ran == [cfg.kwargs["BLOCK_M"], cfg.kwargs["BLOCK_N"], float(cfg.kwargs["PRE_LOAD_V"]), 0.0]
    prune = ns["prune_to_tuned"](ns["CONFIGS"], ns["FORWARD_PROBLEMS"])
    with pytest.raises(KeyError, match="no argument 'DTYPE' for DTYPE"):
        prune(ns["AUTOTUNE_CONFIGS"], {"HEAD_DIM": 64, "IS_CAUSAL": True, "N_CTX": 2048, "GQA_RATIO": 1})


# ---------------------------------------------------------------------- the shipped databases
@pytest.mark.parametrize("gpu", ["h100", "mi250", "mi300x", "mi355x"])
def test_every_shipped_database_exports_every_entry(gpu, tmp_path, monkeypatch, capsys):
    from rocmflash.db.entries import family

    monkeypatch.setenv(D.CONFIG_DIR_ENV, str(tmp_path))
    stored = D.ConfigDB.read(os.path.join(ROOT, "configs", f"{gpu}.json"))["entries"]
    ns = _exec(_export(capsys, "--gpu", gpu))
    out = json.loads(_export(capsys, "--gpu", gpu, "--format", "json"))
    exported = {key: fam for fam, section in out["families"].items() for key in section["entries"]}
    assert exported == {key: family(key) for key in stored}
    assert sorted(ns["MEASURED"]) == sorted(key for key, fam in exported.items()
                                            if "triton_config" in out["families"][fam]["entries"][key])
    for key, measured in ns["MEASURED"].items():
        assert measured is (stored[key]["measured"] and stored[key].get("timing") != "interpreter"), key


# ---------------------------------------------------------------------- bad input: one line, exit 2
def _one_line_error(capsys, argv) -> str:
    assert main(["export", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("error: ") and captured.err.count("\n") == 1, captured.err
    return captured.err


def test_bad_input_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(D.CONFIG_DIR_ENV, str(tmp_path / "none"))
    assert "unknown GPU 'mi999'; known GPUs: " in _one_line_error(capsys, ["--gpu", "mi999"])
    assert "mi300x" in _one_line_error(capsys, ["--gpu", "mi999"])
    assert "is a directory" in _one_line_error(capsys, ["--gpu", "mi300x", "--db", str(tmp_path)])
    missing = str(tmp_path / "gone.json")
    assert f"--db {missing}: no such file" in _one_line_error(capsys, ["--gpu", "mi300x", "--db", missing])
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    assert "not valid JSON" in _one_line_error(capsys, ["--gpu", "mi300x", "--db", str(broken)])
    other = _write_db(tmp_path / "h100.json", "h100", "sm_90", {})
    assert "holds configs for 'h100', not 'mi300x'" in _one_line_error(capsys, ["--gpu", "mi300x", "--db", other])


# ---------------------------------------------------------------------- on a GPU
@pytest.mark.gpu
def test_exported_forward_configs_launch_on_the_live_gpu(live, compiled, tmp_path, monkeypatch, capsys):
    """Each distinct forward and packed-forward config of the live GPU's shipped database, as the export writes
    it, compiles and launches through ``triton.autotune`` on the real backend (AMD: its options as launch
    options), and the kernel sees the config's tile."""
    import torch
    import triton.language as tl

    if not os.path.exists(os.path.join(ROOT, "configs", f"{live.name}.json")):
        pytest.skip(f"no shipped database for {live.name}")
    monkeypatch.setenv(D.CONFIG_DIR_ENV, str(tmp_path))
    ns = _exec(_export(capsys, "--gpu", live.name))
    configs = list({str(c): c for c in ns["AUTOTUNE_CONFIGS"] + ns["VARLEN_AUTOTUNE_CONFIGS"]}.values())
    if not configs:
        pytest.skip(f"the {live.name} database holds no forward config")

    @triton.jit
    def probe(Q, Out, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRE_LOAD_V: tl.constexpr):
        i = tl.arange(0, 4)
        q = tl.load(Q + i)
        tl.store(Out + i, q + tl.where(i == 0, BLOCK_M, tl.where(i == 1, BLOCK_N, tl.where(i == 2, PRE_LOAD_V, 0))))

    q = torch.randint(-8, 8, (4,), device="cuda").float()  # integers: q + 64 - q is exactly 64 in fp32
    for cfg in configs:
        out = torch.full((4,), float("nan"), device="cuda")
        triton.autotune(configs=[cfg], key=[])(probe)[(1,)](q, out)  # one config: launched as is, not timed
        assert (out - q).tolist() == [cfg.kwargs["BLOCK_M"], cfg.kwargs["BLOCK_N"], float(cfg.kwargs["PRE_LOAD_V"]),
                                      0.0], str(cfg)
