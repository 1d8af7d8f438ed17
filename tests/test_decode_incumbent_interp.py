"""Decode-shaped calls and the platform's SDPA: run-time dispatch from a ``decode-`` entry's ``incumbent`` (timed
eagerly, host time included) through every dense entry point, the cases that keep the decode kernel, ``rocmflash
explain`` for a decode call, the worker's gate (``measure_decode``) and ``rocmflash db refresh-incumbents --decode``'s
entry writing on a fake timing function -- in Triton's interpreter (CPU)."""

import math
import os
import types

import pytest
import torch

from rocmflash.api import incumbent, ops, selection
from rocmflash.kernels.launch import observe_launches
from varlen_reference import attention_fp64, rel_err

pytestmark = pytest.mark.usefixtures("fresh_selection")

B, HQ, HKV, SK, D = 2, 8, 2, 512, 32  #: the test problem: GQA 4, decode-shaped with one query token
CFG = {"BLOCK_N": 32, "num_warps": 2, "num_stages": 1, "waves_per_eu": 0, "num_splits": 0}
SDPA_WINS = {"backend": "default", "time_ms": 0.010, "triton_ms": 0.030, "timing": incumbent.DECODE_TIMING,
             "backends": {"default": {"status": "ok", "time_ms": 0.010}}}
TRITON_WINS = dict(SDPA_WINS, time_ms=0.040)


@pytest.fixture(autouse=True)
def _fresh_decode():
    from rocmflash.api import decode

    decode.clear_cache()
    yield
    decode.clear_cache()


def _decode_db(tmp_path, monkeypatch, field, batch=B, seqlen_k=SK, group=HQ // HKV, extra=None):
    """A user database for 'h100' holding one fp16 decode entry (``field``: its incumbent, None: none)."""
    from rocmflash import db
    from rocmflash.tuning.decode import decode_key

    monkeypatch.setenv(db.CONFIG_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(db, "shipped_config_dir", lambda: str(tmp_path / "no-shipped"))
    monkeypatch.setattr(selection, "device_identity", lambda device: ("h100", "sm_90"))
    store = db.ConfigDB.open(str(tmp_path / "h100.json"), "h100", "sm_90", {"test": True})
    entry = {"mode": "decode", "best": dict(CFG), "measured": True, "timing": "gpu graph replay (cold K/V copies)"}
    if field is not None:
        entry["incumbent"] = field
    store.put(decode_key(D, "fp16", group, seqlen_k, batch), entry)
    for key, e in (extra or {}).items():
        store.put(key, e)
    store.save()
    return str(tmp_path / "h100.json")


def _qkv(Sq=1, batch=B, seqlen_k=SK, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, h, s, D, generator=g).half() for h, s in ((HQ, Sq), (HKV, seqlen_k), (HKV, seqlen_k))]


def _ref(q, k, v):
    outs = [attention_fp64(q[b].transpose(0, 1), k[b].transpose(0, 1), v[b].transpose(0, 1),
                           1 / math.sqrt(D), False)[0].transpose(0, 1) for b in range(q.shape[0])]
    return torch.stack(outs)


def _entry_points():
    import rocmflash
    from rocmflash.api import sdpa

    def patched(q, k, v):
        with sdpa.patch_sdpa():
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    return {
        "attention": lambda q, k, v: rocmflash.attention(q, k, v),
        "flash_attn_func": lambda q, k, v: rocmflash.flash_attn_func(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2),
        "op": lambda q, k, v: ops.attention_op(q, k, v, need_lse=False)[0],
        "patch_sdpa": patched,
    }


ENTRIES = ["attention", "flash_attn_func", "op", "patch_sdpa"]


@pytest.mark.parametrize("entry", ENTRIES)
def test_decode_call_runs_sdpa_where_the_decode_entry_says_it_won(interpret, tmp_path, monkeypatch, sdpa_spy, entry):
    _decode_db(tmp_path, monkeypatch, SDPA_WINS)
    q, k, v = _qkv()
    with observe_launches() as seen:
        out = _entry_points()[entry](q, k, v)
    assert seen == [] and sdpa_spy == [("default", False)]
    assert out.shape == q.shape and rel_err(out, _ref(q, k, v)) < 1e-2


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("field", ["triton-wins", "no-field", "no-entry"])
def test_decode_call_runs_the_decode_kernel_otherwise(interpret, tmp_path, monkeypatch, sdpa_spy, entry, field):
    if field == "no-entry":  # only a forward-shaped entry: no decode entry of this problem
        _decode_db(tmp_path, monkeypatch, SDPA_WINS, group=1)
    else:
        _decode_db(tmp_path, monkeypatch, TRITON_WINS if field == "triton-wins" else None)
    q, k, v = _qkv(seed=1)
    with observe_launches() as seen:
        out = _entry_points()[entry](q, k, v)
    assert "_decode_split" in {r["kernel"] for r in seen} and sdpa_spy == []
    assert rel_err(out, _ref(q, k, v)) < 1e-2


def test_the_served_decode_entry_config_reaches_the_kernel(interpret, tmp_path, monkeypatch):
    """The entry whose incumbent lost is the one whose config the decode kernel runs (num_warps 2)."""
    import rocmflash

    _decode_db(tmp_path, monkeypatch, TRITON_WINS)
    q, k, v = _qkv()
    with observe_launches() as seen:
        rocmflash.attention(q, k, v)
    split = [r for r in seen if r["kernel"] == "_decode_split"]
    assert split and split[0]["options"]["num_warps"] == 2


def test_one_causal_token_is_sdpas_non_causal_call(interpret, tmp_path, monkeypatch, sdpa_spy):
    """Bottom-right causal with one query: the token sees every key; SDPA is asked without its top-left mask."""
    import rocmflash

    _decode_db(tmp_path, monkeypatch, SDPA_WINS)
    q, k, v = _qkv(seed=2)
    out = rocmflash.attention(q, k, v, causal=True)
    assert sdpa_spy == [("default", False)] and rel_err(out, _ref(q, k, v)) < 1e-2


@pytest.mark.parametrize("case", ["lse", "torch-op", "causal-3-queries", "grad", "switch", "far-batch", "kvcache"])
def test_decode_kernel_where_the_incumbent_does_not_apply(interpret, tmp_path, monkeypatch, sdpa_spy, case):
    import rocmflash

    _decode_db(tmp_path, monkeypatch, SDPA_WINS)
    q, k, v = _qkv(Sq=3 if case == "causal-3-queries" else 1, batch=8 if case == "far-batch" else B, seed=3)
    if case == "switch":
        monkeypatch.setenv(selection.NO_INCUMBENT_ENV, "1")
    with observe_launches() as seen:
        if case == "lse":
            out = rocmflash.attention(q, k, v, return_lse=True)[0]
        elif case == "torch-op":  # the op returns the LSE, which SDPA does not give
            out = torch.ops.rocmflash.attn_fwd(q, k, v, False, 1 / math.sqrt(D), "online", "")[0]
        elif case == "grad":  # decode entries time inference only
            q.requires_grad_(True)
            out = rocmflash.attention(q, k, v)
        elif case == "kvcache":  # SDPA cannot take cache_seqlens: flash_attn_with_kvcache keeps the decode kernel
            out = rocmflash.flash_attn_with_kvcache(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                    cache_seqlens=torch.full((B,), SK, dtype=torch.int32))
            out = out.transpose(1, 2)
        else:
            out = rocmflash.attention(q, k, v, causal=case == "causal-3-queries")
    assert "_decode_split" in {r["kernel"] for r in seen} and sdpa_spy == []
    if case != "causal-3-queries":
        assert rel_err(out.detach(), _ref(q.detach(), k, v)) < 1e-2


def test_lookup_is_cached_per_signature_and_bucket(interpret, tmp_path, monkeypatch):
    """The database is read once per KV-length and batch bucket; a repeat call reads nothing."""
    import rocmflash

    _decode_db(tmp_path, monkeypatch, SDPA_WINS)
    reads, real = [], ops.decode_timing
    monkeypatch.setattr(ops, "decode_timing", lambda *a, **kw: reads.append(a) or real(*a, **kw))
    for seqlen_k in (SK, SK, SK - 7):  # 505 keys: the same bucket, another signature
        q, k, v = _qkv(seqlen_k=seqlen_k)
        rocmflash.attention(q, k, v)
    assert len(reads) == 1
    assert ops.decode_incumbent(torch.device("cpu"), D, torch.float16, 4, SK, B) == "default"
    assert ops.decode_incumbent(torch.device("cpu"), D, torch.float16, 4, 4 * SK, B) is None  # 2 buckets away
    assert ops.decode_incumbent(torch.device("cpu"), D, torch.float16, 4, 2 * SK, B) == "default"  # 1 away


def test_hf_unmasked_decode_step_follows_the_entry(interpret, tmp_path, monkeypatch, sdpa_spy):
    from rocmflash.integrations import hf

    calls, real = [], hf._served_step
    monkeypatch.setattr(hf, "_served_step", lambda *a: calls.append(1) or real(*a))
    module = types.SimpleNamespace(is_causal=True)
    for field in (SDPA_WINS, TRITON_WINS):
        selection.clear_cache()
        _decode_db(tmp_path, monkeypatch, field)
        q, k, v = _qkv(seed=4)
        with observe_launches() as seen:
            out, _ = hf.rocmflash_attention_forward(module, q, k, v, None, scaling=1 / math.sqrt(D))
        assert out.shape == (B, 1, HQ, D)
        assert rel_err(out.transpose(1, 2), _ref(q, k, v)) < 1e-2
        assert (seen == []) == (field is SDPA_WINS)
    assert len(calls) == 2


def test_hf_served_step_is_kept_for_the_other_layers(interpret, tmp_path, monkeypatch, sdpa_spy):
    """A step the entry gives SDPA is decided by its first layer; the other layers (same shapes, dtypes, device,
    scaling) run the kept SDPA call with no checks -- unless ROCMFLASH_NO_INCUMBENT is set, the call carries a
    sliding window, a mask or another scaling, or rocmflash.clear_cache ran (a new database may say otherwise)."""
    from rocmflash.api.selection import NO_INCUMBENT_ENV
    from rocmflash.integrations import hf

    module = types.SimpleNamespace(is_causal=True)
    scale = 1 / math.sqrt(D)
    selection.clear_cache()
    _decode_db(tmp_path, monkeypatch, SDPA_WINS)
    q, k, v = _qkv(seed=6)
    want = _ref(q, k, v)
    decided, real = [], hf._served_step
    monkeypatch.setattr(hf, "_served_step", lambda *a: decided.append(1) or real(*a))
    checked, real_check = [], hf._unroutable_reason
    monkeypatch.setattr(hf, "_unroutable_reason", lambda *a, **kw: checked.append(1) or real_check(*a, **kw))

    def layer(**kwargs):
        before = hf.stats()
        with observe_launches() as seen:
            out, _ = hf.rocmflash_attention_forward(module, q, k, v, kwargs.pop("mask", None),
                                                    scaling=kwargs.pop("scaling", scale), **kwargs)
        assert rel_err(out.transpose(1, 2), want) < 1e-2
        return hf.stats()["incumbent"] - before["incumbent"], seen

    assert layer(position_ids=None, use_cache=True) == (1, [])  # the step's first layer decides
    assert (len(decided), len(checked)) == (1, 1)
    for _ in range(3):  # the other layers: kept, nothing checked again
        assert layer(position_ids=None, use_cache=True) == (1, [])
    assert (len(decided), len(checked)) == (1, 1)
    served, seen = layer(scaling=None)  # another scaling argument (the same value): decided anew, then kept
    assert served == 1 and seen == [] and len(decided) == 2
    monkeypatch.setenv(NO_INCUMBENT_ENV, "1")  # read per call, kept steps included
    served, seen = layer()
    assert served == 0 and "_decode_split" in {r["kernel"] for r in seen}
    monkeypatch.delenv(NO_INCUMBENT_ENV)
    served, seen = layer(sliding_window=4 * SK)  # a window (wider than the cache): the decode kernel, never SDPA
    assert served == 0 and "_decode_split" in {r["kernel"] for r in seen}
    served, seen = layer(mask=torch.ones(B, 1, 1, SK, dtype=torch.bool))  # a mask: not the kept call
    assert served == 0
    selection.clear_cache()  # forgets the kept steps with the database's answers
    assert hf._KEPT_STEPS == {}
    assert layer()[0] == 1 and len(decided) == 4  # (the third: the NO_INCUMBENT call, decided and not kept)


def test_hf_masked_single_sequence_step_follows_the_entry(interpret, tmp_path, monkeypatch):
    """A static cache's step (batch 1, the free slots masked): where the decode entry timed SDPA faster, transformers'
    own SDPA path runs it with the mask, as without rocmflash; else the decode kernel reads the used keys. A batch of
    two (padding possible) keeps the kernel whatever the entry says."""
    from rocmflash.integrations import hf

    module = types.SimpleNamespace(is_causal=True, num_key_value_groups=HQ // HKV)  # what transformers' path reads
    used = SK - 100  # keys written so far; the rest of the static cache is free (masked)
    for batch, field in ((1, SDPA_WINS), (1, TRITON_WINS), (2, SDPA_WINS)):
        selection.clear_cache()
        _decode_db(tmp_path, monkeypatch, field, batch=batch)
        q, k, v = _qkv(batch=batch, seed=5)
        mask = torch.zeros(batch, 1, 1, SK, dtype=torch.bool)
        mask[..., :used] = True
        before = hf.stats()["sdpa"]
        with observe_launches() as seen:
            out, _ = hf.rocmflash_attention_forward(module, q, k, v, mask, scaling=1 / math.sqrt(D))
        want = _ref(q, k[:, :, :used], v[:, :, :used])
        assert out.shape == (batch, 1, HQ, D) and rel_err(out.transpose(1, 2), want) < 1e-2
        to_sdpa = batch == 1 and field is SDPA_WINS
        assert (hf.stats()["sdpa"] - before == 1) == to_sdpa and (seen == []) == to_sdpa, (batch, field)
        before = hf.stats()["sdpa"]  # the step's next layer: the route kept by the first (same answer)
        with observe_launches() as seen:
            again, _ = hf.rocmflash_attention_forward(module, q, k, v, mask, scaling=1 / math.sqrt(D))
        assert torch.equal(again, out) and (hf.stats()["sdpa"] - before == 1) == to_sdpa, (batch, field)
        assert (seen == []) == to_sdpa


def test_explain_shows_the_decode_entry_both_times_and_the_kvcache_route(tmp_path, monkeypatch):
    from rocmflash.cli.explain import explain

    path = _decode_db(tmp_path, monkeypatch, SDPA_WINS)
    res = explain("h100", D, "fp16", False, 1, seqlen_k=SK, gqa_ratio=4, db_path=path, check=False, batch=B)
    runs = res["runs"]
    assert runs["forward"]["runs"] == "SDPA (default)" and runs["forward"]["sdpa_ms"] == 0.01
    assert runs["forward"]["rocmflash_ms"] == 0.03 and "host time included" in runs["forward"]["why"]
    assert runs["decode_entry"] == f"decode-d{D}-fp16-gqa4-kv{SK}-b{B}" and runs["timing"] == incumbent.DECODE_TIMING
    assert "flash_attn_with_kvcache always runs the decode kernel" in runs["kvcache"]
    assert "decode kernel" in runs["forward+backward"]["runs"]
    far = explain("h100", D, "fp16", False, 1, seqlen_k=SK, gqa_ratio=4, db_path=path, check=False, batch=32)
    assert far["runs"]["forward"]["runs"].startswith("rocmflash") and "buckets away" in far["runs"]["forward"]["why"]
    path = _decode_db(tmp_path, monkeypatch, TRITON_WINS)
    lost = explain("h100", D, "fp16", False, 1, seqlen_k=SK, gqa_ratio=4, db_path=path, check=False, batch=B)
    assert lost["runs"]["forward"]["runs"].startswith("rocmflash") and "as fast or faster" in lost["runs"]["forward"]["why"]
    with pytest.raises(ValueError, match="batch"):
        explain("h100", D, "fp16", False, 1, seqlen_k=SK, gqa_ratio=4, db_path=path, check=False, batch=0)


def test_cli_explain_takes_the_batch_of_a_decode_problem(tmp_path, monkeypatch, capsys):
    import json

    from rocmflash.cli import main

    path = _decode_db(tmp_path, monkeypatch, SDPA_WINS)
    argv = ["explain", "--gpu", "h100", "--head-dim", str(D), "--dtype", "fp16", "--seqlen", "1", "--seqlen-k", str(SK),
            "--gqa", "4", "--db", path, "--no-compile", "--json"]
    for batch, runs in ((B, "SDPA (default)"), (32, "rocmflash")):
        assert main(argv + ["--batch", str(batch)]) == 0
        assert json.loads(capsys.readouterr().out)["runs"]["forward"]["runs"].startswith(runs), batch
    assert main(argv + ["--batch", "0"]) == 2
    assert "batch" in capsys.readouterr().err


def test_measure_decode_gates_the_route_with_the_entry_config_and_each_backend(interpret, monkeypatch, sdpa_spy):
    """Both sides are the public call: the decode kernel with the forced config, then each backend through the
    dispatch (whatever ROCMFLASH_NO_INCUMBENT says outside: it is restored after)."""
    from rocmflash.tuning.incumbent_worker import measure_decode

    monkeypatch.setenv(selection.NO_INCUMBENT_ENV, "1")
    problem = {"head_dim": D, "dtype": "fp16", "heads_q": HQ, "heads_kv": HKV, "batch": 3, "seqlen_k": 300}
    with observe_launches() as seen:
        res = measure_decode(problem, dict(CFG, num_warps=1), ["default", "cudnn"])
    assert res["status"] == "ok" and res["triton_rel_err"] < 1e-2 and res["config"]["num_warps"] == 1
    assert {r["options"]["num_warps"] for r in seen if r["kernel"] == "_decode_split"} == {1}
    assert sdpa_spy == [("default", False), ("cudnn", False)]  # gated through the dispatch, one call each
    assert os.environ[selection.NO_INCUMBENT_ENV] == "1" and not ops._CALLS  # no plan keeps a forced side
    assert res["backends"]["default"]["status"] == "skipped" and res["backends"]["default"]["rel_err"] < 1e-2
    assert res["backends"]["cudnn"]["status"] in ("failed", "skipped")  # cuDNN: no CPU kernel
    assert res["triton_ms"] is None and "host time included" in res["timing"]
    assert incumbent.decode_field(res)["backend"] is None  # nothing timed: no incumbent decides
    with pytest.raises(ValueError, match="page_size"):
        measure_decode(dict(problem, page_size=16))


def _refresh_module():
    from rocmflash.cli import db

    return db


def test_refresh_decode_writes_entries_from_a_timing_function():
    """Existing decode entries are timed with their own config and keep it; every grid problem the database
    lacks is added with the served config; paged and fp8-cache entries are left alone; a failed route
    leaves its entry out."""
    from rocmflash.tuning.decode import decode_key

    bench = _refresh_module()
    grid = dict(bench.DECODE_GRID)
    existing = decode_key(128, "bf16", 4, 2048, 1)  # a grid problem already in the database
    entries = {existing: {"mode": "decode", "problem": bench.grid_problems()[0], "best": dict(CFG, num_splits=64),
                          "measured": True, "time_ms": 0.0077},
               decode_key(128, "bf16", 8, 8192, 8, page_size=256): {"best": CFG, "problem": {}, "measured": True},
               "d128-bf16-full-gqa1-s2048": {"best": {}, "measured": True}}
    assert bench.grid_problems()[0]["heads_kv"] == 8 and bench.grid_problems()[0]["batch"] == 1
    measured = []

    def measure(problem, config):
        measured.append((problem["batch"], problem["seqlen_k"], problem["heads_kv"], config))
        if problem["seqlen_k"] == 65536 and problem["batch"] == 32 and problem["heads_kv"] == 32:
            return {"status": "incorrect", "error": "relative error 1", "triton_ms": None}
        fast = problem["batch"] * problem["seqlen_k"] >= 8 * 32768  # SDPA wins the small ones
        return {"status": "ok", "triton_ms": 0.05 if not fast else 1.0,
                "backends": {"default": {"status": "ok", "time_ms": 0.02 if not fast else 1.1},
                             "cudnn": {"status": "failed", "error": "no"}}}

    notes = []
    stamp = {"when": "2026-11-26T00:00:00Z", "fingerprint": {"device": "test"}}
    only = bench.refresh_decode(entries, measure, lambda p: CFG, stamp, notes.append, keys={existing})
    assert list(only) == [existing] and len(measured) == 1
    measured.clear()
    new = bench.refresh_decode(entries, measure, lambda p: dict(CFG, num_warps=8), stamp, notes.append)
    n_grid = len(grid["batch"]) * len(grid["seqlen_k"]) * len(grid["heads_kv"])
    assert len(measured) == n_grid and measured[0] == (1, 2048, 8, dict(CFG, num_splits=64))
    assert all(m[3] is None for m in measured[1:])  # added problems: the served config, by the route itself
    assert len(new) == n_grid - 1 and decode_key(128, "bf16", 1, 65536, 32) not in new
    assert any("not refreshed" in n for n in notes)
    kept = new[existing]
    assert kept["best"] == dict(CFG, num_splits=64) and kept["time_ms"] == 0.0077
    assert kept["incumbent"]["backend"] == "default" and kept["incumbent"]["time_ms"] == 0.02
    assert kept["incumbent"]["triton_ms"] == 0.05 and kept["incumbent"]["timing"] == incumbent.DECODE_TIMING
    assert incumbent.winner(kept["incumbent"], False) == "default"
    added = new[decode_key(128, "bf16", 1, 65536, 8)]
    assert added["best"] == dict(CFG, num_warps=8) and added["measured"] and "served-config" in added["strategy"]
    assert added["problem"]["heads_q"] == 32 and added["problem"]["seqlen_q"] == 1 and added["when"] == stamp["when"]
    assert added["fingerprint"] == {"device": "test"}
    assert incumbent.winner(added["incumbent"], False) is None  # the decode kernel won this one
    assert added["incumbent"]["backends"]["cudnn"]["status"] == "failed"


def test_shape_rules_for_one_causal_token():
    """One causal query token is SDPA's non-causal call only where the decode entry decides (decode-shaped); a
    short one-token causal call keeps the forward's rule (causal with Sq != Sk: rocmflash)."""
    assert incumbent.shape_excludes(True, 1, SK, 4) is None and incumbent.sdpa_causal(True, 1) is False
    assert "top-left" in incumbent.shape_excludes(True, 1, 64, 4)  # not decode-shaped
    assert "top-left" in incumbent.shape_excludes(True, 3, SK, 4)
    assert incumbent.shape_excludes(True, 64, 64, 4) is None and incumbent.sdpa_causal(True, 64) is True
