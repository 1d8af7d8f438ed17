"""Every stand-in of a timed launch builds the timed binary: the 2 GiB line of AMD's buffer loads.

On AMD, Triton reads a tensor whose storage is under 2 GiB with buffer loads and one past it
with global loads. The live gate, the pre-warm launches and the static (compile-only) builds
all stand in for the timed launch with smaller tensors; each must keep every tensor on the
timed tensor's side of the line, or it builds (and the pruner judges) another binary. The
binary facts here are real gfx942 cross-compiles (``buffer_load`` / ``global_load`` in the
assembly).
"""

import math

import pytest
import torch

from rocmflash.config import KernelConfig
from rocmflash.hw.roofline import Shape
from rocmflash.kernels import build
from rocmflash.tuning import live_gate
from rocmflash.tuning import live_worker as LW

LINE = 2**31 - 1  #: Triton's AMD backend: storage <= this is addressed with 32-bit buffer offsets
#: the issue's example: q, k, v and out are exactly 2 GiB each, one byte past the line
BIG = Shape(batch=16, heads_q=32, heads_kv=32, seqlen_q=16384, seqlen_k=16384, head_dim=128, dtype="fp16")
SMALL = Shape(batch=4, heads_q=32, heads_kv=8, seqlen_q=4096, seqlen_k=4096, head_dim=128, dtype="bf16")


def _own(dims, itemsize=2):
    return math.prod(dims) * itemsize


# ----------------------------------------------------------------------------- the rule
def test_the_rule_is_triton_s_line_and_stand_ins_keep_their_side():
    assert not live_gate.beyond_32bit_range(LINE) and live_gate.beyond_32bit_range(LINE + 1)
    assert live_gate.build_bytes(LINE) == 0 and live_gate.build_bytes(2**31) == 2**31
    assert live_gate.stand_in_bytes(1000, 10**6) == 1000  # both under: its own size
    assert live_gate.stand_in_bytes(1000, 2**32) == LINE + 1  # only the real one past: just past the line
    assert live_gate.stand_in_bytes(2**32, 2**33) == 2**32  # both past: its own size
    with pytest.raises(ValueError, match="crosses the 2 GiB line"):
        live_gate.stand_in_bytes(2**32, 1000)


def test_static_problem_and_the_prewarm_cross_compile_follow_the_same_rule():
    from rocmflash.tuning.spec import static_problem

    for make in (static_problem, LW.prewarm_problem):
        big, small = make(BIG), make(SMALL)
        assert (big.batch, big.seqlen_q, big.seqlen_k) == (16, 16384, 16384)  # real sizes: global loads
        assert small.batch == 1


# ----------------------------------------------------------------------------- the gate and the pre-warm
def test_the_gate_of_a_big_problem_builds_with_storage_past_2_gib():
    specs = live_gate.gate_specs(BIG)
    assert all(dims[0] == 1 for dims, _ in specs.values())  # still a batch-1 gate
    plan = live_gate.storage_plan(specs, 2)
    assert set(plan) == {"q", "k", "v", "out"} and all(n > LINE for n in plan.values()), plan
    small = live_gate.gate_specs(SMALL)
    assert live_gate.storage_plan(small, 2) == {n: _own(d) for n, (d, _) in small.items()}


def test_the_forward_prewarm_of_a_big_problem_launches_with_storage_past_2_gib():
    cfg = KernelConfig(BLOCK_M=128, BLOCK_N=64, num_warps=4)
    _, sq, sk = LW.prewarm_plan(None, cfg, BIG, 304)
    plan = live_gate.storage_plan(LW.prewarm_specs(BIG, sq, sk), 2)
    assert sq < BIG.seqlen_q and all(n > LINE for n in plan.values()), plan
    small = LW.prewarm_specs(SMALL, 256, 256)
    assert live_gate.storage_plan(small, 2) == {n: _own(d) for n, (d, _) in small.items()}


def test_the_tuning_workers_prewarms_of_big_problems_stand_for_their_storage():
    from rocmflash.tuning import backward, decode, varlen, varlen_worker

    half, rows = backward.prewarm_specs(BIG)
    assert all(n > LINE for n in live_gate.storage_plan(half, 2).values())
    assert live_gate.storage_plan(rows, 4) == {n: _own(d, 4) for n, (d, _) in rows.items()}  # 32 MiB LSE: under
    packed = varlen.VarlenProblem.spread(64, 8192, heads_q=32, heads_kv=32, head_dim=128)  # 2.3 GiB q, k, v
    assert all(n > LINE for n in live_gate.storage_plan(varlen_worker.prewarm_specs(packed), 2).values())
    pool = decode.DecodeProblem(batch=64, seqlen_k=131072, page_size=256).validate()  # 16 GiB page pools
    plan = live_gate.storage_plan(decode.prewarm_specs(pool), 2)
    assert plan["k"] > LINE and plan["v"] > LINE and plan["q"] < LINE


def test_decode_prewarm_builds_each_side_of_the_partial_buffers():
    """Split counts of one specialisation (multiples of 16) whose fp32 partials lie on both sides of the
    line run two binaries: the pre-warm launches both, each with a workspace on its side."""
    from rocmflash.kernels.decode.host import DecodeCall
    from rocmflash.tuning import decode

    p = decode.DecodeProblem(batch=1024, heads_q=64, heads_kv=8, seqlen_k=8192).validate()
    call = DecodeCall(1, 1, 8, 8, 128, False, 0, 0.1, 0.0, 1 << 30, 1 << 30)
    launches = decode.prewarm_launches(p, call, [1, 2, 4, 8, 16, 32, 64])
    assert launches == [(1, 1), (2, 2), (16, 16), (16, 32)]  # 16 splits: 1 GiB of partials; 32: 2 GiB
    plan = live_gate.storage_plan(decode.partial_specs(p, call, 16, 32), 4)
    assert plan["po"] > LINE and plan["pl"] < LINE
    assert decode.prewarm_launches(decode.DecodeProblem().validate(), call, [1, 2, 4, 16, 64]) == [
        (1, 1), (2, 2), (16, 16)]


def test_stand_ins_past_the_line_share_one_storage_past_it(monkeypatch):
    monkeypatch.setattr(build, "MAX_32BIT_RANGE", 4096 - 1)  # pretend 2 GiB is 4 KiB
    specs = {"q": ((1, 2, 8, 16), 8192), "k": ((1, 1, 8, 16), 8192), "lens": ((4,), 8)}
    t = live_gate.stand_ins(specs, torch.float16, torch.device("cpu"), pad=True)
    assert t["q"].untyped_storage().nbytes() >= 4096 and t["q"].untyped_storage().data_ptr() == \
        t["k"].untyped_storage().data_ptr()
    assert t["lens"].untyped_storage().nbytes() == 8  # its real tensor is under the line: its own storage
    assert t["k"].data_ptr() >= t["q"].data_ptr() + t["q"].numel() * 2 and t["k"].data_ptr() % 16 == 0
    assert all(x.shape == d and bool(x.isfinite().all()) for x, (d, _) in zip(t.values(), specs.values()))
    plain = live_gate.stand_ins(specs, torch.float16, torch.device("cpu"), pad=False)
    assert plain["q"].untyped_storage().nbytes() == 512


class _Exact:
    """A stand-in forward that writes the fp32 reference's answer."""

    def launch(self, q, k, v, cfg, causal, scale, out):
        self.tensors = (q, k, v, out)
        out.copy_(live_gate.reference(q, k, v, causal, scale).to(out.dtype))


def test_the_gate_launches_on_storage_past_the_line_when_the_timed_tensors_are(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(build, "MAX_32BIT_RANGE", 64 * 1024 - 1)  # pretend 2 GiB is 64 KiB
    monkeypatch.setattr(live_gate, "pads_storage", lambda: True)  # as on ROCm
    live_gate._GATE.clear()
    shape = Shape(batch=8, heads_q=4, heads_kv=2, seqlen_q=48, seqlen_k=80, head_dim=32, dtype="fp16")
    kernel = _Exact()
    try:
        ok, err, why = live_gate.gate(kernel, KernelConfig(BLOCK_M=16, BLOCK_N=16, num_warps=4), shape)
    finally:
        live_gate._GATE.clear()
    assert ok and err < 1e-3, why
    q, k, v, out = kernel.tensors
    assert q.shape[0] == 1 and all(t.untyped_storage().nbytes() >= 64 * 1024 for t in (q, k, v, out))


# ----------------------------------------------------------------------------- static builds (gfx942)
def _loads(kernel) -> tuple:
    asm = kernel.asm["amdgcn"]
    return asm.count("buffer_load"), asm.count("global_load")


def _one_uses_global_loads(small, big):
    (s_buf, s_glob), (b_buf, b_glob) = _loads(small), _loads(big)
    assert small.hash != big.hash
    assert s_buf > 0, "under 2 GiB the tensors are read with buffer loads"
    assert b_glob > s_glob and b_buf < s_buf, "past 2 GiB the cache/packed tensors are read with global loads"


def test_decode_builds_for_a_large_cache_use_global_loads():
    from rocmflash.kernels.decode import host as KD

    cfg = KD.default_decode_config("gfx942", 128)
    for paged in (False, True):
        small = KD.compile_for("gfx942", cfg, 128, "bf16", group=8, paged=paged)[0]
        big = KD.compile_for("gfx942", cfg, 128, "bf16", group=8, paged=paged, cache_bytes=3 << 30)[0]
        _one_uses_global_loads(small, big)
    with pytest.raises(ValueError, match="cache_bytes"):
        KD.compile_for("gfx942", cfg, 128, cache_bytes=-1)


def test_varlen_forward_builds_for_a_large_packed_batch_use_global_loads():
    from rocmflash.kernels.varlen import host as VK

    cfg = KernelConfig(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=1, waves_per_eu=2)
    small = VK.compile_forward_for("gfx942", cfg, 128, "bf16", group=4, total_tokens=65536)  # 0.5 GiB q
    big = VK.compile_forward_for("gfx942", cfg, 128, "bf16", group=4, total_tokens=1 << 20)  # 8 GiB q
    _one_uses_global_loads(small, big)


def _captured_problem(monkeypatch, module, gpu, problem, configs):
    """The problem dict ``module.static_phase`` hands the sweep (the sweep itself compiles in this process)."""
    from rocmflash.static import compile as sweep_module

    seen = []

    def sweep_family(family, cfgs, prob, gpu, *args, **kwargs):
        seen.append(prob)
        return [sweep_module.observe({"family": family, "config": c, "problem": prob, "fingerprint": "-",
                                      "gpu": gpu.name}) for c in cfgs], None

    monkeypatch.setattr(sweep_module, "sweep_family", sweep_family)
    module.static_phase(gpu, problem, configs=configs)
    return seen[0]


def test_the_static_phases_build_a_big_problem_with_its_storage(monkeypatch):
    """decode, varlen and varlen-bwd static phases hand their sweeps the real storage of a big problem, so its
    builds (and its compile-cache keys) are the global-load ones; a small problem's keep buffer loads."""
    from rocmflash.hw.gpus import get_gpu
    from rocmflash.kernels.decode.host import default_decode_config
    from rocmflash.static.compile import family_fingerprint
    from rocmflash.static.families import get_family
    from rocmflash.tuning import decode, varlen, varlen_bwd

    gpu = get_gpu("mi300x")
    dcfg = dict(default_decode_config("gfx942", 128).to_dict(), num_splits=0)
    vcfg = KernelConfig(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=1, waves_per_eu=2).to_dict()
    bcfg = {"kernel": "dq", "BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1, "waves_per_eu": 0}
    cases = [(decode, "decode", dcfg, decode.DecodeProblem(batch=64, seqlen_k=131072).validate(),
              decode.DecodeProblem(batch=8, seqlen_k=4096).validate()),
             (varlen, "varlen", vcfg, varlen.VarlenProblem.spread(64, 8192, heads_q=32, heads_kv=8),
              varlen.VarlenProblem.spread(8, 4096, heads_q=32, heads_kv=8)),
             (varlen_bwd, "varlen_bwd", bcfg, varlen.VarlenProblem.spread(64, 8192, heads_q=32, heads_kv=8),
              varlen.VarlenProblem.spread(8, 4096, heads_q=32, heads_kv=8))]
    for module, family, cfg, big, small in cases:
        built = []
        for problem in (small, big):
            prob = _captured_problem(monkeypatch, module, gpu, problem, [cfg])
            built.append((get_family(family).compile_task(gpu.triton_target(), cfg, prob)[0], prob))
        (small_k, small_p), (big_k, big_p) = built
        _one_uses_global_loads(small_k, big_k)
        fam = get_family(family)
        assert family_fingerprint(fam, cfg, big_p, gpu) != family_fingerprint(fam, cfg, small_p, gpu)
    assert "tokens" not in varlen.VarlenProblem.spread(8, 4096).compile_dict()  # under the line: one shared build
