"""The first-use build check on a live GPU (issue 48, item 2; :mod:`rocmflash.api.build_check`): a served config
whose recorded profile claims more waves per SIMD and fewer VGPRs than the real compile gives is replaced at its
first launch by the entry's next near-best config, with one warning, from the compiled kernel Triton built anyway
(on CUDA its ``n_regs`` / ``n_spills``, on AMD its code object); results stay right (fp32 reference)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from rocmflash.api import build_check, selection
from rocmflash.config import KernelConfig, default_config

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fresh_selection", "compiled")]

D, S = 64, 256


def test_a_record_that_disagrees_with_the_real_compile_is_replaced_at_first_use(live, tmp_path, monkeypatch):
    db = pytest.importorskip("rocmflash.db")
    monkeypatch.setenv(db.CONFIG_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(db, "shipped_config_dir", lambda: str(tmp_path / "no-shipped"))
    monkeypatch.setattr(build_check, "_WARNED", set())
    monkeypatch.delenv(build_check.NO_BUILD_CHECK_ENV, raising=False)
    best = default_config(live.arch, D)
    near = KernelConfig(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=1)
    assert near != best
    # the served config's record claims what no real build reaches: 64 waves per SIMD on 8 registers
    claimed = {"status": "ok", "kernel": "_fwd_online", "vgprs": 8, "agprs": 0, "sgprs": None, "vgpr_spills": 0,
               "sgpr_spills": 0, "scratch_bytes": 0, "spills_in_loop": False, "scratch_loop_ops": 0,
               "lds_bytes": 0, "waves_per_simd": 64, "limiter": "vgpr"}
    modest = dict(claimed, vgprs=255, waves_per_simd=1, lds_bytes=None)  # the near-best one: any real build holds
    d = db.ConfigDB.open(str(tmp_path / f"{live.name}.json"), live.name, live.arch, {"test": True})
    d.put(db.problem_key(D, "fp16", False, 1, S),
          {"best": best.to_dict(), "measured": True, "static_profile": claimed, "compiler": {"triton": "recorded"},
           "near_best": [{"config": near.to_dict(), "time_ms": 1.0, "static_profile": modest}]})
    d.save()
    selection.clear_cache()

    real_reader, profiles = build_check.kernel_profile, []

    def spy(launch, backend):  # the real reader, on Triton's real compiled kernel
        profiles.append((launch.cfg, real_reader(launch, backend)))
        return profiles[-1][1]

    monkeypatch.setattr(build_check, "kernel_profile", spy)
    import rocmflash

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for seed in range(3):
            g = torch.Generator(device="cuda").manual_seed(seed)
            q, k, v = (torch.randn(2, 4, S, D, device="cuda", generator=g, dtype=torch.float16) for _ in range(3))
            out = rocmflash.attention(q, k, v)
            qf, kf, vf = (t.float() for t in (q, k, v))
            ref = torch.softmax(qf @ kf.transpose(-1, -2) / math.sqrt(D), -1) @ vf
            assert ((out.float() - ref).norm() / ref.norm()).item() < 1e-2
    assert [cfg for cfg, _ in profiles] == [best, near]  # each build read once, at its first launch
    real = profiles[0][1]
    assert real["status"] == "ok" and 8 < real["vgprs"] <= 512 and 1 <= real["waves_per_simd"] < 64, real
    (warning,) = [w for w in caught if "first use" in str(w.message)]
    assert f"waves/SIMD 64 -> {real['waves_per_simd']}" in str(warning.message)
    assert selection.select_config(q.device, D, torch.float16, False, 1, S, S) == near
