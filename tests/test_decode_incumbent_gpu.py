"""GPU test of the decode incumbent (skipped without a CUDA/ROCm GPU in the catalog): ``measure_decode`` times the
decode route and the platform's SDPA backends eagerly (host time included) on the live GPU, its field in a
``decode-`` entry makes every dense entry point run the winner with the right answer, and where SDPA is chosen
the dispatch adds at most a few µs to SDPA's own eager call."""


import pytest
import torch

from rocmflash.db import ConfigDB, environment
from conftest import spy_on_incumbent

pytestmark = [pytest.mark.gpu]

B, HQ, HKV, SK, D = 1, 32, 8, 2048, 128  #: issue 28's most host-bound decode point
PROBLEM = {"head_dim": D, "dtype": "bf16", "heads_q": HQ, "heads_kv": HKV, "batch": B, "seqlen_k": SK}


def _inputs():
    gen = torch.Generator(device="cuda").manual_seed(3)
    q = torch.randn(B, 1, HQ, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    kc, vc = (torch.randn(B, SK, HKV, D, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    return q.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2)


def _ref(q, k, v):
    g = HQ // HKV
    s = q.float() @ k.float().repeat_interleave(g, 1).transpose(-1, -2) / D ** 0.5
    return torch.softmax(s, -1) @ v.float().repeat_interleave(g, 1)


def _db(tmp_path, monkeypatch, live, entry):
    from rocmflash.api import decode, selection
    from rocmflash.tuning.decode import decode_key

    monkeypatch.setenv("ROCMFLASH_CONFIG_DIR", str(tmp_path))
    monkeypatch.delenv("ROCMFLASH_NO_DB", raising=False)
    monkeypatch.delenv(selection.NO_INCUMBENT_ENV, raising=False)
    store = ConfigDB.open(str(tmp_path / f"{live.name}.json"), live.name, live.arch,
                          environment(torch.cuda.get_device_name()))
    store.put(decode_key(D, "bf16", HQ // HKV, SK, B), entry)
    store.save()
    selection.clear_cache()
    decode.clear_cache()


def test_measured_decode_incumbent_dispatches_on_the_gpu(live, tmp_path, monkeypatch):
    import rocmflash
    from rocmflash.api import incumbent, ops, sdpa
    from rocmflash.kernels.launch import observe_launches
    from rocmflash.tuning.incumbent_worker import measure_decode

    res = measure_decode(PROBLEM, None, rounds=3, iters=30)
    assert res["status"] == "ok" and res["triton_ms"] > 0 and res["backends"]["default"]["status"] == "ok", res
    field = incumbent.decode_field(res)
    assert field["backend"] in incumbent.candidates() and field["time_ms"] > 0 and "host" in field["timing"]
    q, k, v = _inputs()
    ref = _ref(q, k, v)
    calls = spy_on_incumbent(monkeypatch)

    def patched():
        with sdpa.patch_sdpa():
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    entries = {"attention": lambda: rocmflash.attention(q, k, v), "patch_sdpa": patched,
               "flash_attn_func": lambda: rocmflash.flash_attn_func(q.transpose(1, 2), k.transpose(1, 2),
                                                                    v.transpose(1, 2)).transpose(1, 2),
               "op": lambda: ops.attention_op(q, k, v, need_lse=False)[0]}
    # the measured field, then one forced each way: the winner runs through every entry point
    sdpa_wins = dict(field, backend="default", time_ms=0.001, triton_ms=1.0)
    triton_wins = dict(field, backend="default", time_ms=1.0, triton_ms=0.001)
    for f in (field, sdpa_wins, triton_wins):
        _db(tmp_path, monkeypatch, live, {"mode": "decode", "problem": PROBLEM, "measured": True,
                                          "best": res["config"], "incumbent": f})
        want = incumbent.winner(f, False)
        for name, fn in entries.items():
            calls.clear()
            with observe_launches() as seen:
                out = fn()
            torch.cuda.synchronize()
            assert ((out.float() - ref).norm() / ref.norm()).item() < 2e-2, name
            assert (calls == [want]) if want else (calls == [] and seen), (name, want, calls, seen)
    # (what the dispatch costs over SDPA's own call is measured by benchmarks/decode_entry.py and benchmarks/host_overhead.py,
    # not asserted here: a lent host's timings move by more than the few µs at stake)
