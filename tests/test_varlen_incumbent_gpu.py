"""GPU: ``flash_attn_varlen_func`` served by torch's own ``varlen_attn`` where a varlen entry says it won.

A database written for the live GPU says the incumbent beat the Triton kernels, forward and training steps; calls
then run torch's function (checked by which kernels ran: no Triton launch) and must match an fp32 reference computed
per sequence, outputs and gradients, causal and full attention (GQA where this torch takes it); wrong ``cu_seqlens`` values reach torch's kernel only as safe copies (no
memory outside the tensors is touched: the process survives and later calls are right) and are reported."""

import math

import pytest
import torch

from rocmflash import db as D
from rocmflash.api import selection
from rocmflash.api import varlen_incumbent as VI
from rocmflash.hw.platform import varlen_attn
from rocmflash.tuning import varlen as TV

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("compiled")]


@pytest.fixture
def incumbent_db(live, tmp_path, monkeypatch):
    if varlen_attn()[0] is None:
        pytest.skip("this torch has no torch.nn.attention.varlen.varlen_attn")
    entries = {}
    for causal, group in ((True, 1), (False, 1), (True, 4)):
        entries[TV.varlen_key(128, "bf16", group, causal, 2048)] = {
            "mode": "varlen", "measured": True, "timing": "gpu (L2 flushed, median)",
            "best": {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2}, "time_ms": 1.0,
            "incumbent": {"backend": VI.NAME, "time_ms": 0.5, "triton_ms": 1.0,
                          "train": {"backend": VI.NAME, "time_ms": 1.5, "triton_ms": 3.0},
                          "backends": {VI.NAME: {"status": "ok", "time_ms": 0.5, "train_ms": 1.5}}}}
    data = D.ConfigDB.new_data(live.name, live.arch, {})
    data["entries"] = entries
    D.atomic_write_json(str(tmp_path / f"{live.name}.json"), data)
    monkeypatch.setenv(D.CONFIG_DIR_ENV, str(tmp_path))
    monkeypatch.delenv(selection.NO_INCUMBENT_ENV, raising=False)
    monkeypatch.delenv(selection.NO_DB_ENV, raising=False)
    D.clear_cache()
    selection.clear_cache()
    yield
    D.clear_cache()
    selection.clear_cache()


def _pack(lengths, hq=16, hkv=16, d=128, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    q = torch.randn(sum(lengths), hq, d, device="cuda", generator=gen).to(torch.bfloat16)
    k, v = (torch.randn(sum(lengths), hkv, d, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(2))
    return q, k, v, cu


def _reference(q, k, v, cu, causal):
    out = torch.empty(q.shape, dtype=torch.float32, device="cuda")
    group = q.shape[1] // k.shape[1]
    bounds = cu.tolist()
    for b in range(len(bounds) - 1):
        lo, hi = bounds[b], bounds[b + 1]
        qs = q[lo:hi].float().transpose(0, 1)
        ks, vs = (t[lo:hi].float().repeat_interleave(group, 1).transpose(0, 1) for t in (k, v))
        s = qs @ ks.transpose(1, 2) / math.sqrt(q.shape[2])
        if causal:
            s.masked_fill_(torch.ones(hi - lo, hi - lo, dtype=torch.bool, device="cuda").triu(1), float("-inf"))
        out[lo:hi] = (torch.softmax(s, -1) @ vs).transpose(0, 1)
    return out


@pytest.mark.parametrize("causal", [True, False])
def test_the_incumbent_serves_and_matches_the_reference(incumbent_db, monkeypatch, causal):
    import rocmflash
    from rocmflash.kernels.varlen import host as VK

    launched = []
    real = VK.launch_forward
    monkeypatch.setattr(VK, "launch_forward", lambda *a: launched.append(a) or real(*a))
    lengths = [517, 1500, 33, 2000, 1024]
    q, k, v, cu = _pack(lengths, seed=int(causal))
    with torch.no_grad():
        out = rocmflash.flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths), causal=causal)
    rocmflash.api.varlen.check_errors(q.device)
    assert launched == []  # torch's kernel ran, not rocmflash's
    ref = _reference(q, k, v, cu, causal)
    err = ((out.float() - ref).norm() / ref.norm()).item()
    assert err < 2e-2, err
    # a training call: the entry's training steps say torch's won too -- its forward and backward run
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    out = rocmflash.flash_attn_varlen_func(*leaves, cu, cu, max(lengths), max(lengths), causal=causal)
    do = torch.randn_like(out)
    grads = torch.autograd.grad(out, leaves, do)
    assert launched == []
    ref_leaves = [t.detach().float().requires_grad_(True) for t in (q, k, v)]
    ref_grads = torch.autograd.grad(_reference(*ref_leaves, cu, causal), ref_leaves, do.float())
    for got, want in zip(grads, ref_grads):
        assert ((got.float() - want).norm() / want.norm()).item() < 2e-2
    # ... but not in deterministic mode (FlashAttention's backward accumulates with atomics)
    torch.use_deterministic_algorithms(True)
    try:
        rocmflash.flash_attn_varlen_func(*leaves, cu, cu, max(lengths), max(lengths), causal=causal)
    finally:
        torch.use_deterministic_algorithms(False)
    assert len(launched) == 1


def test_gqa_runs_the_incumbent_only_where_this_torch_takes_it(incumbent_db, monkeypatch):
    import rocmflash
    from rocmflash.kernels.varlen import host as VK

    launched = []
    real = VK.launch_forward
    monkeypatch.setattr(VK, "launch_forward", lambda *a: launched.append(a) or real(*a))
    lengths = [900, 1200, 77]
    q, k, v, cu = _pack(lengths, hq=16, hkv=4, seed=9)
    with torch.no_grad():
        out = rocmflash.flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths), causal=True)
    takes_gqa = "enable_gqa" in varlen_attn()[1]
    assert (launched == []) == takes_gqa
    ref = _reference(q, k, v, cu, True)
    assert ((out.float() - ref).norm() / ref.norm()).item() < 2e-2


def test_wrong_lengths_are_reported_and_touch_nothing_outside(incumbent_db):
    import rocmflash

    lengths = [700, 1300, 48]
    q, k, v, cu = _pack(lengths, seed=5)
    total = sum(lengths)
    for bad in ([0, 700, 2000, 10**9], [0, 1500, 700, total], [-5000, 700, 2000, total]):
        with torch.no_grad():
            rocmflash.flash_attn_varlen_func(q, k, v, torch.tensor(bad, dtype=torch.int32, device="cuda"), cu,
                                             max(lengths), max(lengths))
        with pytest.raises(ValueError, match="cu_seqlens_q"):
            rocmflash.api.varlen.check_errors(q.device)
    with torch.no_grad():  # the device is healthy and the next call right
        out = rocmflash.flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths))
    ref = _reference(q, k, v, cu, False)
    assert ((out.float() - ref).norm() / ref.norm()).item() < 2e-2
