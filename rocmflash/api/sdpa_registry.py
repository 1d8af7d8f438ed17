"""rocmflash as torch's own flash attention implementation (``torch.nn.attention``'s registry).

torch 2.13 (and every torch that has ``torch.nn.attention.register_flash_attention_impl``) lets a
library plug its flash attention into ``F.scaled_dot_product_attention``, as flash-attn 3 and 4 do::

    import rocmflash, torch
    torch.nn.attention.activate_flash_attention_impl("rocmflash")   # SDPA's flash backend is rocmflash now
    ...
    torch.nn.attention.restore_flash_attention_impl()               # torch's own flash again

``import rocmflash`` (before or after torch) registers the name ``"rocmflash"``; nothing changes until
the user activates it (torch asks providers never to activate on import). Activation replaces the
kernels of ``aten::_scaled_dot_product_flash_attention`` and its backward for the ``CUDA`` dispatch
key, which ROCm's torch uses for HIP devices too. Unlike :func:`rocmflash.patch_sdpa` (a monkeypatch of
``torch.nn.functional.scaled_dot_product_attention``, which code that bound the function before the patch
does not see), this reaches every SDPA call however it was bound, and torch.compile's graphs too: the
op is torch's, only its kernel is rocmflash's.

Only the calls that SDPA sends to its flash backend arrive here: torch has already checked the mask
(none), the layout and the dtypes. Which backend SDPA picks is still SDPA's choice (priority order,
``torch.nn.attention.sdpa_kernel``). A call rocmflash cannot compute exactly (dropout, a debug mask,
causal with ``Sq != Sk`` -- torch's flash causal is top-left aligned there, rocmflash's bottom-right --
a head dim outside 16..256) raises a ``RuntimeError`` that says so and how to restore torch's kernel:
never a silently different result. The kernels are rocmflash's own (the database's config per problem);
this path never hands the call back to SDPA, whose flash kernel it replaces.

A torch without the registry keeps :func:`rocmflash.patch_sdpa` (``docs/dropin.md``, *SDPA*).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

#: the name ``torch.nn.attention.activate_flash_attention_impl`` takes
IMPL_NAME = "rocmflash"

#: the aten ops whose kernels an activation replaces
FORWARD_OP = "_scaled_dot_product_flash_attention"
BACKWARD_OP = "_scaled_dot_product_flash_attention_backward"

_RESTORE = "torch.nn.attention.restore_flash_attention_impl() gives torch's own flash kernel back"

_CALLS = {"forward": 0, "backward": 0}  #: the calls rocmflash's kernels served since import (:func:`stats`)


def stats() -> dict:
    """``{"forward": n, "backward": m}``: SDPA flash calls rocmflash's kernels served in this process."""
    return dict(_CALLS)


def registry(torch_module) -> Optional[object]:
    """``torch.nn.attention`` when this torch has the flash-implementation registry, else None."""
    attention = getattr(getattr(torch_module, "nn", None), "attention", None)
    if attention is None or not callable(getattr(attention, "register_flash_attention_impl", None)):
        return None
    return attention


def register_with_torch(torch_module) -> bool:
    """Register :data:`IMPL_NAME` with ``torch_module``'s registry (activation stays the user's); whether it has one.

    Called by ``import rocmflash`` once torch is imported; cheap (a dict entry): the kernels are imported
    when the user activates the implementation."""
    attention = registry(torch_module)
    if attention is None:
        return False
    attention.register_flash_attention_impl(IMPL_NAME, register_fn=activate)
    return True


@dataclasses.dataclass
class ActiveImpl:
    """What an activation keeps alive: the ``torch.library.Library`` holding the two kernels. ``remove()``
    (torch's ``restore_flash_attention_impl``) drops it, which unregisters them."""

    library: object

    def remove(self) -> None:
        self.library = None


def activate(dispatch_key: str = "CUDA") -> ActiveImpl:
    """Replace the kernels of SDPA's flash ops for ``dispatch_key`` with rocmflash's (the registry's
    ``register_fn``; the tests pass ``"CPU"`` to run it in Triton's interpreter)."""
    import torch

    library = torch.library.Library("aten", "IMPL", dispatch_key)
    library.impl(FORWARD_OP, flash_forward, dispatch_key)
    library.impl(BACKWARD_OP, flash_backward, dispatch_key)
    return ActiveImpl(library)


def unsupported(query, key, value, dropout_p: float, is_causal: bool, return_debug_mask: bool) -> Optional[str]:
    """Why rocmflash cannot compute this flash call exactly, or None."""
    import torch

    if dropout_p != 0.0:
        return f"has no dropout (dropout_p={dropout_p})"
    if return_debug_mask:
        return "returns no debug attention mask"
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        return f"takes 4-D (B, H, S, D) tensors, got {query.dim()}-D, {key.dim()}-D and {value.dim()}-D"
    if query.dtype not in (torch.float16, torch.bfloat16) or key.dtype != query.dtype or value.dtype != query.dtype:
        return f"takes fp16/bf16 query, key and value of one dtype, got {query.dtype}, {key.dtype}, {value.dtype}"
    B, Hq, Sq, D = query.shape
    Bk, Hkv, Sk, Dk = key.shape
    if tuple(value.shape) != tuple(key.shape) or Bk != B or Dk != D:
        return f"needs key and value of one shape (B, Hkv, Sk, D) matching query {tuple(query.shape)}, got " \
               f"{tuple(key.shape)} and {tuple(value.shape)}"
    if not 16 <= D <= 256:
        return f"supports head dims 16..256, got {D}"
    if Hkv == 0 or Hq % Hkv:
        return f"needs query heads ({Hq}) to be a multiple of key/value heads ({Hkv})"
    if is_causal and Sq != Sk:
        return (f"would mask differently: causal with Sq={Sq} != Sk={Sk} is top-left aligned in torch's flash "
                "attention and bottom-right in rocmflash's")
    return None


def _refuse(why: str) -> RuntimeError:
    return RuntimeError(f"rocmflash, the active flash attention implementation, {why}; {_RESTORE}")


def flash_forward(query, key, value, dropout_p: float = 0.0, is_causal: bool = False,
                  return_debug_mask: bool = False, *, scale: Optional[float] = None):
    """The kernel of ``aten::_scaled_dot_product_flash_attention`` (its schema's arguments and nine results):
    rocmflash's forward with its LSE (fp32 ``(B, Hq, Sq)``, natural log), which the backward reads."""
    import torch

    from rocmflash.api import ops

    why = unsupported(query, key, value, dropout_p, is_causal, return_debug_mask)
    if why is not None:
        raise _refuse(why)
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
    if not math.isfinite(scale):
        raise _refuse(f"needs a finite scale, got {scale}")
    out, lse = ops._forward_impl(query, key, value, bool(is_causal), scale, "online", None, True)
    _CALLS["forward"] += 1
    device = query.device
    rng_state = torch.zeros((2,), dtype=torch.uint64, device=device)  # no dropout: no generator state to keep
    unused = torch.zeros((), dtype=torch.uint64, device=device)
    debug_mask = torch.empty(0, dtype=query.dtype, device=device)
    return out, lse, None, None, query.shape[2], key.shape[2], rng_state, unused, debug_mask


def flash_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k,
                   dropout_p: float, is_causal: bool, philox_seed, philox_offset, *, scale: Optional[float] = None):
    """The kernel of ``aten::_scaled_dot_product_flash_attention_backward``: rocmflash's Triton backward on the
    forward's output and LSE; ``(grad_query, grad_key, grad_value)``."""
    from rocmflash.api import ops

    why = unsupported(query, key, value, dropout_p, is_causal, False)
    if why is not None:
        raise _refuse(why)
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
    grads = ops._backward_impl(grad_out, query, key, value, out, logsumexp, None, bool(is_causal), scale)
    _CALLS["backward"] += 1
    return grads


__all__ = ["IMPL_NAME", "ActiveImpl", "activate", "flash_backward", "flash_forward", "register_with_torch",
           "registry", "stats", "unsupported"]
