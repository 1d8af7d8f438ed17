"""Read and clear an error word in one device operation: :func:`swap`.

A kernel ORs its error bits into a per-device int32 word (:mod:`rocmflash.kernels.error_words`) at any time
after the host queued it. Reading the word and then zeroing it (a copy, later a ``zero_()``) clears, with the
bits it read, every bit a kernel queued between the two set: those reports were lost. :func:`swap` is one
atomic exchange on the device instead -- the word's bits move into a snapshot buffer and the word is 0 in the
same instruction -- so a bit is either in the snapshot (reported from it) or set after the exchange (still in
the word, reported by the next read). The host then reads the snapshot at leisure: ``.item()`` or an
asynchronous copy.

The exchange is a launch of :func:`_swap_word` (one program), through the launch plans
(:func:`rocmflash.kernels.launch.launch_cached`); it runs under Triton's CPU interpreter too, where
``tl.atomic_xchg`` works on CPU tensors. A CPU word with the interpreter off (no kernel can run on it: a word
left from interpreted calls, or a test's stand-in for a GPU word) is read and cleared by two torch ops, which
nothing can come between on the CPU: every kernel there ran synchronously, in the thread that launched it.
Callers never launch it while a CUDA graph is being captured (the graph would clear the word on every replay).
"""

from __future__ import annotations

import triton.language as tl

from rocmflash.config import KernelConfig
from rocmflash.kernels import common as C
from rocmflash.kernels.common import kernel_jit

#: one program of one warp: the kernel is one atomic and one store
_CONFIG = KernelConfig(BLOCK_M=16, BLOCK_N=16, num_warps=1, num_stages=1)
_SCALARS = ("error_swap",)


@kernel_jit
def _swap_word(WORD, SNAPSHOT):
    """``SNAPSHOT[0] = WORD[0]; WORD[0] = 0`` as one atomic exchange: no other kernel's bit falls between."""
    tl.store(SNAPSHOT, tl.atomic_xchg(WORD, 0))


def _build(word, snapshot):
    return lambda: ((1,), dict(WORD=word, SNAPSHOT=snapshot), {})


def swap(word, snapshot) -> None:
    """Move ``word``'s bits into ``snapshot`` and leave ``word`` 0, in one device operation (both int32 ``(1,)``
    tensors of one device). Queued on the current stream; the caller reads ``snapshot`` after it."""
    if word.is_cuda or C.interpreting():
        C.launch_cached(_swap_word, _SCALARS, (word, snapshot), _build(word, snapshot), _CONFIG, C.torch_backend())
    else:  # a CPU word, no interpreter: nothing runs on it between these two ops (see the module's docstring)
        snapshot.copy_(word)
        word.zero_()


__all__ = ["swap"]
