"""Run-time dispatch of ``flash_attn_varlen_func`` to the platform's varlen attention (issue #28, item 2, varlen):
where the nearest measured varlen entry says torch's ``varlen_attn`` beat the Triton winner, a plain forward-only
call runs it on ``cu_seqlens`` copies made safe on the device; every other call keeps the Triton kernel. Under a
fake ROCm GPU (interpreter) with a stand-in for torch's function (it has no CPU kernel), which checks the lists it
is given are inside the packed tensors."""

import inspect
import math

import pytest
import torch

from rocmflash import db as D
from rocmflash.api import selection
from rocmflash.api import varlen_incumbent as VI
from rocmflash.hw import platform
from rocmflash.config import KernelConfig as K
from rocmflash.tuning import varlen as TV

pytestmark = pytest.mark.usefixtures("fake_rocm")

TUNED = K(BLOCK_M=16, BLOCK_N=32, num_warps=2, num_stages=1, waves_per_eu=1)


def _entry(incumbent_ms: float, triton_ms: float = 0.1, train: tuple = ()) -> dict:
    """A measured varlen entry whose incumbent took ``incumbent_ms`` against ``triton_ms``; ``train``: the training
    steps' ``(incumbent ms, rocmflash ms)``."""
    entry = {"mode": "varlen", "measured": True, "timing": "gpu (L2 flushed, median)", "best": TUNED.to_dict(),
             "time_ms": triton_ms,
             "incumbent": {"backend": VI.NAME, "time_ms": incumbent_ms, "triton_ms": triton_ms,
                           "backends": {VI.NAME: {"status": "ok", "time_ms": incumbent_ms}}}}
    if train:
        entry["incumbent"]["train"] = {"backend": VI.NAME, "time_ms": train[0], "triton_ms": train[1]}
        entry["incumbent"]["backends"][VI.NAME]["train_ms"] = train[0]
    return entry


def _write_db(tmp_path, entries: dict) -> None:
    from varlen_reference import write_mi250_db

    write_mi250_db(tmp_path, entries)


class StandIn:
    """torch's varlen_attn (2.13 signature) as fp32 attention per sequence; records the lists it was given and
    checks they address only rows of the packed tensors."""

    def __init__(self):
        self.calls = []

    def __call__(self, query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                 window_size=(-1, -1), enable_gqa=False, seqused_k=None, block_table=None, num_splits=None):
        cq, ck = cu_seq_q.tolist(), cu_seq_k.tolist()
        self.calls.append((cq, ck, window_size, enable_gqa))
        for cu, total in ((cq, query.shape[0]), (ck, key.shape[0])):
            assert cu[0] == 0 and all(0 <= a <= b <= total for a, b in zip(cu, cu[1:])), (cu, total)
        out = torch.zeros_like(query)
        group = query.shape[1] // key.shape[1]
        for b in range(len(cq) - 1):
            q = query[cq[b]:cq[b + 1]].double().transpose(0, 1)
            k, v = (t[ck[b]:ck[b + 1]].double().transpose(0, 1).repeat_interleave(group, 0) for t in (key, value))
            s = q @ k.transpose(1, 2) * (scale or 1 / math.sqrt(query.shape[2]))
            if window_size == (-1, 0):
                s.masked_fill_(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1 + k.shape[1] - q.shape[1]),
                               float("-inf"))
            out[cq[b]:cq[b + 1]] = (torch.softmax(s, -1) @ v).transpose(0, 1).to(query.dtype)
        return out


@pytest.fixture
def stand_in(monkeypatch, tmp_path):
    fn = StandIn()
    monkeypatch.setattr(platform, "_VARLEN_ATTN", [fn, frozenset(inspect.signature(fn.__call__).parameters) - {"self"}])
    monkeypatch.setenv(D.CONFIG_DIR_ENV, str(tmp_path))
    monkeypatch.delenv(selection.NO_INCUMBENT_ENV, raising=False)
    yield fn
    selection.clear_cache()


def _inputs(lens=(7, 40, 23), hq=4, hkv=2, d=32, seed=3):
    gen = torch.Generator().manual_seed(seed)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(sum(lens), hq, d, generator=gen).half()
    k, v = (torch.randn(sum(lens), hkv, d, generator=gen).half() for _ in range(2))
    return q, k, v, cu


def _triton_launches(monkeypatch):
    from rocmflash.kernels.varlen import host as VK

    launched = []
    real = VK.launch_forward
    monkeypatch.setattr(VK, "launch_forward", lambda *a: launched.append(a[6]) or real(*a))
    return launched


@pytest.mark.parametrize("causal", [True, False])
def test_an_entry_the_incumbent_won_runs_it(stand_in, tmp_path, monkeypatch, causal):
    import rocmflash
    from varlen_reference import rel_err, varlen_fp64

    _write_db(tmp_path, {TV.varlen_key(32, "fp16", 2, causal, 64): _entry(0.05)})
    launched = _triton_launches(monkeypatch)
    q, k, v, cu = _inputs()
    out = rocmflash.flash_attn_varlen_func(q, k, v, cu, cu, 40, 40, causal=causal)
    assert launched == [] and len(stand_in.calls) == 1
    cq, ck, window, gqa = stand_in.calls[0]
    assert cq == ck == cu.tolist() and window == ((-1, 0) if causal else (-1, -1)) and gqa is True
    ref, _ = varlen_fp64(q, k, v, cu, cu, 1 / math.sqrt(32), causal=causal)
    assert rel_err(out, ref) < 1e-2
    assert VI.lookup(q.device, 32, q.dtype, causal, 2, 40) == (VI.NAME, TV.varlen_key(32, "fp16", 2, causal, 64), None)


def test_an_entry_the_triton_kernel_won_keeps_it(stand_in, tmp_path, monkeypatch):
    import rocmflash

    _write_db(tmp_path, {TV.varlen_key(32, "fp16", 2, True, 64): _entry(0.2)})
    launched = _triton_launches(monkeypatch)
    q, k, v, cu = _inputs()
    rocmflash.flash_attn_varlen_func(q, k, v, cu, cu, 40, 40, causal=True)
    assert launched == [TUNED] and stand_in.calls == []
    assert VI.lookup(q.device, 32, q.dtype, True, 2, 40)[2] == "rocmflash's kernel was as fast or faster"


@pytest.mark.parametrize("case", ["grad (no training times)", "lse", "window", "softcap", "two cu tensors", "switch off",
                                  "far bucket"])
def test_calls_the_incumbent_does_not_cover_keep_the_triton_kernel(stand_in, tmp_path, monkeypatch, case):
    import rocmflash

    bucket = 1024 if case == "far bucket" else 64
    _write_db(tmp_path, {TV.varlen_key(32, "fp16", 2, True, bucket): _entry(0.05)})
    launched = _triton_launches(monkeypatch)
    q, k, v, cu = _inputs()
    kwargs = dict(causal=True)
    cu_k = cu
    if case.startswith("grad"):
        q.requires_grad_(True)
    elif case == "lse":
        kwargs["return_lse"] = True
    elif case == "window":
        kwargs["window_size"] = (8, 0)
    elif case == "softcap":
        kwargs["softcap"] = 5.0
    elif case == "two cu tensors":
        cu_k = cu.clone()  # equal values, another tensor: the causal diagonal's alignment is not known to agree
    elif case == "switch off":
        monkeypatch.setenv(selection.NO_INCUMBENT_ENV, "1")
    rocmflash.flash_attn_varlen_func(q, k, v, cu, cu_k, 40, 40, **kwargs)
    assert stand_in.calls == [] and len(launched) == 1, case


@pytest.mark.parametrize("train, deterministic, served", [((0.3, 0.4), False, True), ((0.5, 0.4), False, False),
                                                          ((0.3, 0.4), True, False)])
def test_calls_that_need_gradients_follow_the_training_times(stand_in, tmp_path, monkeypatch, train, deterministic,
                                                             served):
    """A call that needs gradients runs torch's function (and its backward) where the training steps say it won,
    never in deterministic mode; the gradients flow either way."""
    import rocmflash
    from varlen_reference import rel_err, varlen_fp64

    _write_db(tmp_path, {TV.varlen_key(32, "fp16", 2, True, 64): _entry(0.05, train=train)})
    launched = _triton_launches(monkeypatch)
    q, k, v, cu = _inputs()
    leaves = [t.double().requires_grad_(True) for t in (q, k, v)]
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: deterministic)
    for t in (q, k, v):
        t.requires_grad_(True)
    out = rocmflash.flash_attn_varlen_func(q, k, v, cu, cu, 40, 40, causal=True)
    assert (len(stand_in.calls), len(launched)) == ((1, 0) if served else (0, 1))
    do = torch.randn_like(out)
    out.backward(do)
    ref, _ = varlen_fp64(*leaves, cu, cu, 1 / math.sqrt(32), causal=True)
    ref.backward(do.double())
    for got, want in zip((q, k, v), leaves):
        assert rel_err(got.grad, want.grad) < 2e-2


def test_wrong_lengths_never_reach_the_platform_kernel_outside_the_tensors(stand_in, tmp_path):
    """Values the host does not read: the platform's kernel gets lists clamped into the packed rows, and the call
    reports what was wrong as the Triton path does."""
    import rocmflash

    _write_db(tmp_path, {TV.varlen_key(32, "fp16", 2, False, 64): _entry(0.05)})
    q, k, v, cu = _inputs()
    for bad in ([0, 7, 47, 999], [0, 30, 20, 70], [3, 7, 47, 70]):
        with pytest.raises(ValueError, match="cu_seqlens_q"):
            rocmflash.flash_attn_varlen_func(q, k, v, torch.tensor(bad, dtype=torch.int32), cu, 40, 40)
    assert len(stand_in.calls) == 3  # each ran on safe lists (checked by the stand-in), then the error was raised
    assert stand_in.calls[0][0] == [0, 7, 47, 70] and stand_in.calls[1][0] == [0, 30, 30, 70]


def test_safe_entries_equal_right_lists_and_clamp_wrong_ones(interpret):
    from rocmflash.kernels.varlen import host as VK
    from rocmflash.kernels.varlen import checks as VC

    def expected(cu, total):
        out, top = [], 0
        for i, x in enumerate(cu):
            top = max(top, x)
            out.append(0 if i == 0 else min(top, total))
        return out

    gen = torch.Generator().manual_seed(0)
    for batch in (1, 3, 200):  # 200: more entries than one step of the running maximum reads
        good = torch.cat([torch.zeros(1, dtype=torch.int32),
                          torch.randint(0, 9, (batch,), generator=gen).cumsum(0).int()])
        total = int(good[-1])
        for cu in (good, good.flip(0).contiguous(), good * 3 - 5):
            safe_q, safe_k = VK.launch_sanitised_lengths(cu, good, batch, total, total, 1 << 20, 1 << 20)
            assert safe_q.tolist() == expected(cu.tolist(), total) and safe_k.tolist() == good.tolist()
            bad = int(VC.error_word(cu.device).item())
            assert bool(bad) == (safe_q.tolist() != cu.tolist()), (cu.tolist(), bad)  # reported exactly when clamped
            VC.error_word(cu.device).zero_()


def test_explain_says_which_varlen_path_runs_and_why(stand_in, tmp_path, capsys):
    from rich.console import Console

    from rocmflash.cli.explain import explain, print_explanation

    _write_db(tmp_path, {TV.varlen_key(32, "fp16", 2, True, 64): _entry(0.05),
                         TV.varlen_key(32, "fp16", 2, False, 64): _entry(0.2)})
    won = explain("mi250", 32, "fp16", True, 40, gqa_ratio=2, check=False)["varlen"]
    assert won == {"entry": TV.varlen_key(32, "fp16", 2, True, 64), "bucket_distance": 0, "incumbent_ms": 0.05,
                   "triton_ms": 0.1, "serves": VI.NAME, "why": None}
    result = explain("mi250", 32, "fp16", False, 40, gqa_ratio=2, check=False)
    assert result["varlen"]["serves"] is None and result["varlen"]["why"] == "rocmflash's kernel was as fast or faster"
    print_explanation(result, Console(width=250))
    assert (f"flash_attn_varlen_func, forward-only calls: rocmflash's varlen kernels, by varlen entry "
            f"{TV.varlen_key(32, 'fp16', 2, False, 64)} (torch varlen_attn 0.2 ms vs rocmflash 0.1 ms): rocmflash's "
            "kernel was as fast or faster") in capsys.readouterr().out
    assert explain("mi250", 32, "fp16", True, 40, gqa_ratio=4, check=False)["varlen"]["why"] == \
        "no measured varlen entry"


@pytest.mark.parametrize("arch", ["gfx90a", "gfx942", "gfx950", "sm_90"])
def test_the_safe_list_kernel_cross_compiles_without_scratch(arch, monkeypatch):
    """The launch before torch's kernel, as LLVM builds it for each target: no scratch, no spills (AMD: read from
    the code object by isa_tools)."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    from rocmflash.kernels import common as C
    from rocmflash.kernels.varlen import host as VK
    from rocmflash.kernels.varlen import checks as VC

    P = C.Ptr
    args = dict(CU_Q=P("*i32"), CU_K=P("*i32"), SAFE_Q=P("*i32"), SAFE_K=P("*i32"), ERR=P("*i32"), TOTAL_Q=70001,
                TOTAL_K=70001, MAX_Q=4097, MAX_K=4097, BATCH=33)
    kernel = C.compile_kernel(VC._sanitise_lengths, arch, args, dict(BLOCK=VK.SANITISE_BLOCK), VK._CHECK_CONFIG)
    assert kernel.asm
    if arch.startswith("gfx"):
        import re

        from isa_tools import kernel_summary, read_code_object

        asm = kernel.asm["amdgcn"]
        (code,) = read_code_object(kernel.asm["hsaco"])
        summary = kernel_summary(code, kernel.metadata.shared, VK._CHECK_CONFIG.num_warps, asm)
        assert summary["vgpr_spill_count"] == 0 and summary["scratch_bytes"] == 0, summary
        occupancy = re.search(r"; Occupancy: (\d+)", asm)
        assert occupancy and summary["waves_per_simd_static"] == int(occupancy.group(1))  # isa_tools agrees with LLVM


def test_an_entry_timed_on_cuda_keeps_the_triton_kernel(stand_in, tmp_path, monkeypatch):
    """torch's varlen_attn won on a CUDA box: on ROCm that timing says nothing, rocmflash's kernel serves and the
    verdict says why."""
    import rocmflash

    entry = _entry(0.05)
    entry["incumbent"]["timed_on"] = {"platform": "cuda", "torch": "2.11.0+cu130", "cuda": "13.0", "hip": None}
    _write_db(tmp_path, {TV.varlen_key(32, "fp16", 2, True, 64): entry})
    launched = _triton_launches(monkeypatch)
    q, k, v, cu = _inputs()
    rocmflash.flash_attn_varlen_func(q, k, v, cu, cu, 40, 40, causal=True)
    assert launched == [TUNED] and stand_in.calls == []
    assert "timed on CUDA (its record) and this torch is ROCm" in VI.lookup(q.device, 32, q.dtype, True, 2, 40)[2]


def test_a_varlen_attn_that_refuses_its_first_call_falls_back_once(stand_in, tmp_path, monkeypatch):
    """torch's function raises on the first served call: that call and every later one of the problem run
    rocmflash's varlen kernel (right results), one warning, no second try -- also after the caches are cleared."""
    import warnings

    import rocmflash
    from rocmflash.api import incumbent
    from varlen_reference import rel_err, varlen_fp64

    monkeypatch.setattr(incumbent, "_FELL_BACK", {})
    monkeypatch.setattr(incumbent, "_WARNED", set())
    tried = []

    def refusing(*args, **kwargs):
        tried.append(1)
        raise RuntimeError("No available kernel. Aborting execution.")
    monkeypatch.setattr(platform, "_VARLEN_ATTN", [refusing, platform._VARLEN_ATTN[1]])  # the stand-in's keywords
    _write_db(tmp_path, {TV.varlen_key(32, "fp16", 2, True, 64): _entry(0.05)})
    launched = _triton_launches(monkeypatch)
    for i, lens in enumerate(((7, 40, 23), (7, 40, 23), (33, 5))):
        if i == 2:
            selection.clear_cache()
        q, k, v, cu = _inputs(lens, seed=20 + i)
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")
            out = rocmflash.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True)
        assert len([w for w in warned if "raised on the first call" in str(w.message)]) == (i == 0)
        ref, _ = varlen_fp64(q, k, v, cu, cu, 1 / math.sqrt(32), causal=True)
        assert rel_err(out, ref) < 1e-2 and len(launched) == i + 1
    assert tried == [1]
