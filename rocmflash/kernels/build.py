"""Compile-only builds: cross-compile a kernel for any target, as a launch of the same arguments would build it.

What the static phase runs (no GPU, no tensors): a :class:`Ptr` stands in for each tensor
argument and :func:`compile_kernel` gives Triton the signature, specialisation and
attributes a launch would give it -- asked of the target's own backend where Triton has the
hook (:func:`launch_attributes`) -- so the build is the one a launch runs (and the same entry
of Triton's cache: a live tune launches the static phase's builds).
"""

from __future__ import annotations

import functools
from typing import Any

import triton
from triton.runtime.jit import JITFunction

from rocmflash.config import KernelConfig


class Ptr:
    """Stand-in for a tensor argument in a compile-only build: its Triton element type and storage size.

    Triton's backends specialise a tensor argument on its address (16-byte aligned: every
    torch allocation is) and, on AMD, on whether its storage fits 32-bit offsets (< 2 GiB:
    the loads become buffer loads). The stand-in answers those two questions the way a
    tensor of ``nbytes`` would (default 0: a tensor well under 2 GiB, as almost every
    attention operand is).
    """

    def __init__(self, ty: str, nbytes: int = 0):
        self.ty = ty
        self.nbytes = int(nbytes)

    def data_ptr(self) -> int:
        return 0  # aligned

    def ptr_range(self) -> int:
        """The bytes a kernel may address from this pointer (Triton's AMD backend reads it)."""
        return self.nbytes


def as_target(target: Any):
    """A ``GPUTarget`` from a GPUTarget, an arch string (``gfx942``, ``sm_90``) or a catalog GPU name."""
    from triton.backends.compiler import GPUTarget

    if isinstance(target, GPUTarget):
        return target
    if hasattr(target, "triton_target"):
        return target.triton_target()
    name = str(target).strip().lower()
    if name.startswith("gfx"):
        return GPUTarget("hip", name, 32 if name.startswith("gfx1") else 64)
    if name.startswith("sm_") and name[3:].isdigit():
        return GPUTarget("cuda", int(name[3:]), 32)
    from rocmflash.gpus import get_gpu

    return get_gpu(name).triton_target()


def specialise_int(value: int) -> tuple[str, bool]:
    """``(signature type, divisible by 16)`` of an integer launch argument, as Triton's launcher specialises it.

    Triton's documented rule (stable across 3.x; restated here rather than imported from
    its internals, which moved between releases): 1 becomes a compile-time constant, a
    multiple of 16 is marked divisible by 16, the type is the narrowest of i32/i64/u64.
    """
    if value == 1:
        return "constexpr", False
    ty = "i32" if -2**31 <= value < 2**31 else ("u64" if value >= 2**63 else "i64")
    return ty, value % 16 == 0


def compile_kernel(fn: JITFunction, target, args: dict, constexprs: dict, cfg: KernelConfig):
    """Cross-compile ``fn`` for ``target`` as a launch with these arguments would.

    Integer arguments get Triton's launch-time specialisation (``== 1`` becomes a
    constant, multiples of 16 get ``tt.divisibility``); pointers get what the target's
    backend gives a tensor at launch (:func:`launch_attributes`): 16-byte alignment and,
    on AMD, buffer loads for storage under 2 GiB. The build is then the one a launch of
    the same shape runs -- and the same entry of Triton's cache. Returns Triton's
    ``CompiledKernel``.
    """
    from triton.compiler import ASTSource

    target = as_target(target)
    pointer_attrs, int_attrs = launch_attributes(target)
    signature, consts, attrs = {}, {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
            consts[name] = constexprs[name]
            continue
        if name not in args:
            raise TypeError(f"compile_kernel: no value for kernel argument {name!r} of {fn.__name__}")
        val = args[name]
        if isinstance(val, Ptr):
            signature[name] = val.ty
            attrs[(i,)] = pointer_attrs(val)
        elif isinstance(val, float):
            signature[name] = "fp32"
        elif isinstance(val, bool) or not isinstance(val, int):
            raise TypeError(f"compile_kernel: unsupported value {val!r} for {name!r}")
        else:
            ty, divisible = specialise_int(val)
            signature[name] = ty
            if ty == "constexpr":
                consts[name] = val
            else:
                attrs[(i,)] = int_attrs(divisible)
    src = ASTSource(fn=fn, signature=signature, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=target, options=cfg.compile_options(target.backend))


#: the storage size up to which Triton's AMD backend addresses a tensor with 32-bit buffer offsets
MAX_32BIT_RANGE = 2**31 - 1


def launch_attributes(target):
    """``(pointer_attrs(ptr), int_attrs(divisible))``: the compile attributes a launch on ``target`` gives
    a tensor argument (a :class:`Ptr`) and a non-constant integer.

    Asked of the target's Triton backend itself (``get_tensor_specialization`` and
    ``parse_attr``, the hooks its launcher calls), so the static phase compiles what this
    Triton launches: on AMD, a tensor under 2 GiB gets ``tt.pointer_range = 32`` and its
    loads become buffer loads (unless ``AMDGCN_USE_BUFFER_OPS=0``), which changes register
    use. A Triton without those hooks gets the attributes they give in Triton 3.6.
    """
    backend = _backend(target)
    try:
        backend.get_tensor_specialization(Ptr("*fp16"), align=True)
        backend.parse_attr("D")
    except (AttributeError, TypeError):
        def pointer_attrs(ptr):
            return [["tt.divisibility", 16]]

        def int_attrs(divisible):
            return [["tt.divisibility", 16]] if divisible else []
        return pointer_attrs, int_attrs

    def pointer_attrs(ptr):
        return backend.parse_attr(backend.get_tensor_specialization(ptr, align=True))

    def int_attrs(divisible):
        return backend.parse_attr("D" if divisible else "")
    return pointer_attrs, int_attrs


@functools.lru_cache(maxsize=None)
def _backend(target):
    from triton.compiler import make_backend

    return make_backend(target)
