"""Attention sinks: the checks every entry point that takes them shares (:func:`check_sinks`).

gpt-oss gives each query head a learnable logit, its *sink*, in the scaled-score domain: eager
transformers computes ``softmax(cat([q·kᵀ * scale, sink_h]))`` and drops the sink's column, so the sink
joins every row's softmax denominator and adds nothing to the output (a key whose value row is zero).
vLLM calls the tensor ``s_aux``. rocmflash's online and varlen kernels start each row's online softmax
at the sink (:func:`rocmflash.kernels.common.softmax_start`); their LSE includes it, and the backward
returns its gradient (:func:`rocmflash.kernels.backward.host.sink_grad`). A ``-inf`` sink is no sink.
"""

from __future__ import annotations

import torch


def check_sinks(sinks, heads_q: int, device, name: str = "sinks", read_values: bool = False) -> torch.Tensor:
    """``sinks`` checked against the call (a float ``(heads_q,)`` tensor on ``device``), as the contiguous fp32
    tensor the kernels read (differentiable: a gradient reaches ``sinks`` in its own dtype). A bad type, dtype,
    shape or device raises a one-line ``ValueError`` saying what was expected.

    The values are read only with ``read_values`` (``check_values=True`` of the varlen entry): reading them waits
    for the GPU, and a model's sinks change every optimizer step, so checking by default would put a host wait
    in every training step of every layer. Unchecked, a NaN or ``+inf`` sink gives NaN rows for its head, as
    the eager formula (``softmax(cat([scores, sink]))``) does; ``-inf`` is no sink."""
    want = f"a floating-point tensor of shape (Hq,) = ({heads_q},), one logit per query head"
    if not isinstance(sinks, torch.Tensor):
        raise ValueError(f"{name} must be {want}; got {type(sinks).__name__}")
    if not sinks.is_floating_point():
        raise ValueError(f"{name} must be {want}; got dtype {sinks.dtype}")
    if tuple(sinks.shape) != (heads_q,):
        raise ValueError(f"{name} must be {want}; got shape {tuple(sinks.shape)}")
    if sinks.device != device:
        raise ValueError(f"{name} is on {sinks.device} but q is on {device}; all must share a device")
    if read_values:
        _check_values(sinks, name)
    return sinks.to(torch.float32).contiguous()


def _check_values(sinks: torch.Tensor, name: str) -> None:
    """Refuse NaN and ``+inf`` sinks (``-inf``: no sink, allowed); one host read. Not read while torch.compile
    traces (no values) or a CUDA graph is captured (no host read may happen then)."""
    if torch.compiler.is_compiling() or sinks.device.type == "meta":
        return
    if sinks.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return
    bad = torch.isnan(sinks) | (sinks == float("inf"))
    if bool(bad.any()):
        index = int(bad.nonzero()[0, 0])
        raise ValueError(f"{name} must hold finite logits (or -inf: no sink); {name}[{index}] is "
                         f"{float(sinks[index])}")
