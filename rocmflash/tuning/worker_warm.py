"""A timing worker's first use of its device, paid while the static phases still compile.

A timing worker's first measurement carried costs that no later one has: the 2-GPU H200 tune of 2026-11-26
(``docs/evidence/scale-gpus-2026-11-26f-h200x2.md``; traces: ``archive/reports:reports/raw/scale-gpus-2026-11-26f-h200x2/preset``) spent 3.6-3.8 s inside each worker on its first forward
config with a cold cache (0.5-1.6 s warm, 2.0 s on one GPU), and each SDPA incumbent job 2.5-3.5 s more cold
than warm. What a first measurement meets first: the math libraries behind the gate's fp32 reference, the
cache-flush buffer (device identification, a memset), Triton's driver and launcher, and SDPA's backends. On
several GPUs every worker pays them, on its own critical path; its process starts seconds before its first job
(:func:`rocmflash.tuning.pool.early_node_pool`), so :func:`warm_device` pays them there instead.

Every step is best effort: a failure is recorded and left to the measurement that meets it again.
"""

from __future__ import annotations

import os
import time

import triton
import triton.language as tl


@triton.jit
def _touch(X):
    """The smallest launch: Triton's driver utilities and a launcher get built or loaded."""
    tl.store(X, tl.load(X) + 1)


def _torch_ops(dev) -> None:
    """The gate's reference (fp32 matmuls, softmax, masks) and its error norm, random inputs in both 16-bit types."""
    import torch

    from rocmflash.tuning.live_gate import reference

    for dtype in (torch.bfloat16, torch.float16):
        q, k, v = (torch.randn(1, 2, 64, 64, device=dev, dtype=dtype) for _ in range(3))
        ref = reference(q, k, v, True, 0.125)
        torch.linalg.vector_norm(ref - q.float()).item()


def _flush(dev) -> None:
    """The cache-flush buffer every timed run zeroes (its size comes from the device's identity)."""
    from rocmflash.measure import flush_buffer

    buffer = flush_buffer(dev)
    if buffer is not None:
        buffer.zero_()


def _triton_launch(dev) -> None:
    import torch

    x = torch.zeros(1, device=dev, dtype=torch.int32)
    _touch[(1,)](x)


def _sdpa_backends(dev) -> None:
    """Forward and backward of every SDPA backend the incumbent jobs time (cuDNN's handle, flash's and the
    memory-efficient kernels' first loads)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    from rocmflash.hw.platform import sdpa_backend_enum, sdpa_backends

    q, k, v = (torch.randn(1, 2, 128, 64, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    for name in sdpa_backends():
        try:
            with sdpa_kernel([sdpa_backend_enum(name)]):
                F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
        except RuntimeError:  # a backend that refuses this shape here: its incumbent job says so
            pass


STEPS = (("torch", _torch_ops), ("flush", _flush), ("triton", _triton_launch), ("sdpa", _sdpa_backends))


def warm_device(steps=STEPS) -> dict:
    """Run each step once on the worker's current device; ``{step: seconds, or the error's first line}``.
    Nothing on a machine without a GPU or under Triton's interpreter (``{}``)."""
    import torch

    if os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available():
        return {}
    dev = torch.device("cuda", torch.cuda.current_device())
    done: dict = {}
    for name, step in steps:
        start = time.perf_counter()
        try:
            step(dev)
            torch.cuda.synchronize(dev)
            done[name] = round(time.perf_counter() - start, 3)
        except Exception as err:  # noqa: BLE001 - best effort: the measurement meets it again and reports it
            from rocmflash.messages import error_line

            done[name] = error_line(err, 160)
    return done


__all__ = ["warm_device", "STEPS"]
