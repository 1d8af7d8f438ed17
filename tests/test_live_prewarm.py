"""The pre-warm launch builds the very binaries the timed launch runs (same Triton specialisation)."""

import pytest

from rocmflash.config import KernelConfig
from rocmflash.hw.roofline import Shape
from rocmflash.kernels import get_variant
from rocmflash.kernels.common import specialise_int
from rocmflash.tuning.live_worker import prewarm_plan

SHAPES = [Shape(batch=4, heads_q=16, heads_kv=16, seqlen_q=4096, seqlen_k=4096, head_dim=128, dtype="bf16"),
          Shape(batch=1, heads_q=32, heads_kv=4, seqlen_q=16384, seqlen_k=16384, head_dim=128, dtype="fp16"),
          Shape(batch=16, heads_q=25, heads_kv=25, seqlen_q=1024, seqlen_k=1024, head_dim=80, dtype="bf16"),
          Shape(batch=1, heads_q=8, heads_kv=8, seqlen_q=1, seqlen_k=1000, head_dim=64, dtype="fp16"),
          Shape(batch=1, heads_q=2, heads_kv=2, seqlen_q=64, seqlen_k=8192, head_dim=64, dtype="fp16")]
CONFIGS = [KernelConfig(BLOCK_M=128, BLOCK_N=64, num_warps=8, variant="split_kv"),
           KernelConfig(BLOCK_M=64, BLOCK_N=32, num_warps=4, variant="split_kv"),
           KernelConfig(BLOCK_M=64, BLOCK_N=128, num_warps=4, variant="split_kv", num_splits=4),
           KernelConfig(BLOCK_M=128, BLOCK_N=64, num_warps=8)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"B{s.batch}H{s.heads_q}S{s.seqlen_q}x{s.seqlen_k}")
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c.variant}-{c.BLOCK_M}x{c.BLOCK_N}-ns{c.num_splits}")
@pytest.mark.parametrize("cus", [132, 304])
def test_prewarm_launch_has_the_timed_launch_specialisation(shape, cfg, cus):
    mod = get_variant(cfg.variant)
    tiny_cfg, sq, sk = prewarm_plan(mod, cfg, shape, cus)
    assert specialise_int(sq) == specialise_int(shape.seqlen_q) and specialise_int(sk) == specialise_int(shape.seqlen_k)
    assert sq <= max(shape.seqlen_q, 256) and sk <= max(shape.seqlen_k, 2048)  # still a small launch
    if cfg.variant == "split_kv":
        real = mod.choose_splits(cfg, shape.batch * shape.heads_q, shape.seqlen_q, shape.seqlen_k, cus)
        tiny = mod.choose_splits(tiny_cfg, 1 * shape.heads_q, sq, sk, cus)
        assert tiny == real  # NUM_SPLITS is a kernel argument: == 1 and % 16 are specialised
    else:
        assert tiny_cfg == cfg


def test_static_problem_keeps_real_sizes_only_past_2_gib():
    """Under 2 GiB every shape shares the canonical batch-1, S=4096 build; past it (AMD addresses such a
    tensor without buffer loads) the build must see the real sizes -- at batch 1 too."""
    from rocmflash.tuning.spec import static_problem

    small = static_problem(Shape(batch=4, heads_q=32, heads_kv=8, seqlen_q=8192, seqlen_k=8192, head_dim=128))
    assert (small.batch, small.seqlen_q, small.seqlen_k) == (1, 4096, 4096)
    for batch, seqlen in ((1, 1 << 19), (16, 32768)):  # 4 GiB at batch 1; 4 GiB at batch 16
        big = static_problem(Shape(batch=batch, heads_q=32, heads_kv=8, seqlen_q=seqlen, seqlen_k=seqlen,
                                   head_dim=128))
        assert (big.batch, big.seqlen_q, big.seqlen_k) == (batch, seqlen, seqlen)
