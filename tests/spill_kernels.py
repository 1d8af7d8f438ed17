"""Small Triton kernels that spill on purpose, where the test wants it (test helper).

Both hold 32 fp32 values per lane in each named block (one wave, BLOCK = 64 x 32) and
are compiled with a ``waves_per_eu`` that leaves fewer VGPRs than they need:

* :func:`live_across_loop` keeps ``keep`` alive across a loop that never reads it, so
  LLVM stores it before the loop and reloads it after: spills outside any loop;
* :func:`pressure_in_loop` needs ``a``, ``b``, ``acc`` and the loaded tile inside the
  loop at once, so it reloads spilled values on every iteration: spills in the loop.

Their register pressure is fixed by the code here, not by rocmflash's kernels, which
other work tunes.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

SIGNATURE = {"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}
BLOCK = 64 * 32


@triton.jit
def live_across_loop(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    keep = tl.load(x_ptr + offs)
    bound = n + tl.sum(keep).to(tl.int32)  # keep is read before the loop, so its load cannot sink past it
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(1, bound):
        v = tl.load(x_ptr + i * BLOCK + offs)
        acc += v * v
    tl.store(y_ptr + offs, acc + keep)


@triton.jit
def pressure_in_loop(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    a = tl.load(x_ptr + offs)
    b = tl.load(x_ptr + BLOCK + offs)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(2, n):
        v = tl.load(x_ptr + i * BLOCK + offs)
        acc += v * a + b
    tl.store(y_ptr + offs, acc)


KERNELS = {"live_across_loop": live_across_loop, "pressure_in_loop": pressure_in_loop}


def compile_spill_kernel(name: str, arch: str, waves_per_eu: int = 6):
    """Cross-compile one of :data:`KERNELS` for a gfx arch (one wave per workgroup, one stage)."""
    src = ASTSource(fn=KERNELS[name], signature=SIGNATURE, constexprs={"BLOCK": BLOCK})
    return triton.compile(src, target=GPUTarget("hip", arch, 64),
                          options={"num_warps": 1, "num_stages": 1, "waves_per_eu": waves_per_eu})
