"""Compile-only builds: cross-compile a kernel for any target, as a launch of the same arguments would build it.

What the static phase runs (no GPU, no tensors): a :class:`Ptr` stands in for each tensor
argument and :func:`compile_kernel` gives Triton the signature, specialisation and
attributes a launch would give it -- asked of the target's own backend through the hook this
Triton's launcher calls (:func:`launch_attributes`) -- so the build is the one a launch runs
(and the same entry of Triton's cache: a live tune launches the static phase's builds).
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
    """A ``GPUTarget`` from a GPUTarget, an arch string (``gfx942``, ``sm_90``) or a catalog GPU name.

    An AMD arch as a device reports it (``gcnArchName``: ``gfx942:sramecc+:xnack-``) names the
    same target as its base arch: the feature suffix is dropped, since Triton's AMD backend
    parses the arch as ``gfx`` plus digits (and fails on the suffix).
    """
    from triton.backends.compiler import GPUTarget

    if isinstance(target, GPUTarget):
        if target.backend == "hip" and base_arch(target.arch) != target.arch:
            return GPUTarget("hip", base_arch(target.arch), target.warp_size)
        return target
    if hasattr(target, "triton_target"):
        return target.triton_target()
    name = base_arch(str(target).strip().lower())
    if name.startswith("gfx"):
        return GPUTarget("hip", name, 32 if name.startswith("gfx1") else 64)
    if name.startswith("sm_") and name[3:].isdigit():
        return GPUTarget("cuda", int(name[3:]), 32)
    from rocmflash.hw.gpus import get_gpu

    return get_gpu(name).triton_target()


def base_arch(arch: str) -> str:
    """``gfx942`` from ``gfx942:sramecc+:xnack-`` (an AMD arch, lower case, without its feature suffix);
    other names unchanged."""
    arch = str(arch)
    return arch.split(":", 1)[0].strip().lower() if arch.strip().lower().startswith("gfx") else arch


def specialise_int(value: int) -> tuple[str, bool]:
    """``(signature type, divisible by 16)`` of an integer launch argument, as Triton's launcher specialises it.

    Triton's documented rule (stable across 3.x; restated here rather than imported from
    its internals, which moved between releases): 1 becomes a compile-time constant, a
    multiple of 16 is marked divisible by 16, the type is the narrowest of i32/i64/u64.
    """
    if value == 1:
        return "constexpr", False
    return int_type(value), value % 16 == 0


def int_type(value: int) -> str:
    """The signature type Triton gives an integer launch argument, specialised or not: the narrowest of
    i32/i64/u64 that holds it."""
    return "i32" if -2**31 <= value < 2**31 else ("u64" if value >= 2**63 else "i64")


def compile_kernel(fn: JITFunction, target, args: dict, constexprs: dict, cfg: KernelConfig):
    """Cross-compile ``fn`` for ``target`` as a launch with these arguments would.

    Integer arguments get Triton's launch-time specialisation (``== 1`` becomes a
    constant, multiples of 16 get ``tt.divisibility``), except the kernel's unspecialised
    ones (:func:`~rocmflash.kernels.common.jit_unspecialised`), typed by range only; pointers
    get what the target's backend gives a tensor at launch (:func:`launch_attributes`): 16-byte alignment and,
    on AMD, buffer loads for storage under 2 GiB. The build is then the one a launch of
    the same shape runs -- and the same entry of Triton's cache. Returns Triton's
    ``CompiledKernel``.
    """
    from triton.compiler import ASTSource

    target = as_target(target)
    pointer_attrs, int_attrs = launch_attributes(target)
    unspecialised = getattr(fn, "unspecialised", ())
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
        elif name in unspecialised:  # typed by range, no attribute (never constant nor divisible): as launched
            signature[name] = int_type(val)
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

    Asked of the target's Triton backend itself, through the hooks its launcher calls
    (:func:`specialisation_hooks`) and ``parse_attr``, so the static phase compiles what this
    Triton launches. On AMD a tensor under 2 GiB gets ``tt.pointer_range = 32`` (its loads
    become buffer loads, which changes register use) whenever Triton's buffer ops are on:
    by default from Triton 3.6, only with ``AMDGCN_USE_BUFFER_OPS=1`` in 3.4/3.5.
    """
    backend = _backend(target)
    tensor_spec, int_spec = specialisation_hooks(backend)

    def pointer_attrs(ptr):
        return backend.parse_attr(tensor_spec(ptr))

    def int_attrs(divisible):
        # any multiple of 16 / any other non-constant value: the launcher only asks ``value % 16``
        return backend.parse_attr(int_spec(16 if divisible else 17))
    return pointer_attrs, int_attrs


def specialisation_hooks(backend):
    """``(tensor_spec(arg), int_spec(value))``: the backend's launch-time specialisation strings.

    Triton 3.6+ asks ``get_tensor_specialization(arg, align=)`` and
    ``get_int_specialization(value, align=)``; Triton 3.4/3.5 ask one hook,
    ``get_arg_specialization(arg, ty, align=)`` with ``ty`` ``"tensor"`` or ``"int"``. Both are
    called as the launcher calls them (``align=True``: no argument of rocmflash's kernels is
    exempt from alignment specialisation). A backend with neither hook (a Triton outside the
    supported range) is a TypeError rather than a build that silently differs from a launch.
    """
    if hasattr(backend, "get_tensor_specialization"):  # Triton 3.6+
        return (lambda arg: backend.get_tensor_specialization(arg, align=True),
                lambda value: backend.get_int_specialization(value, align=True))
    if hasattr(backend, "get_arg_specialization"):  # Triton 3.4, 3.5
        return (lambda arg: backend.get_arg_specialization(arg, "tensor", align=True),
                lambda value: backend.get_arg_specialization(value, "int", align=True))
    raise TypeError(f"launch_attributes: Triton's {type(backend).__name__} has neither get_tensor_specialization "
                    "(Triton 3.6+) nor get_arg_specialization (3.4/3.5); expected a supported Triton")


@functools.lru_cache(maxsize=None)
def _backend(target):
    from triton.compiler import make_backend

    return make_backend(target)
