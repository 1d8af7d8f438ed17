"""A fake ROCm layer for CPU-only CI: torch and Triton report an AMD GPU, kernels run in the interpreter.

What it fakes (and nothing more):

* ``torch.version.hip`` (a ROCm build of torch; ``torch.version.cuda`` becomes None);
* ``torch.cuda``: ``is_available``, ``device_count``, ``current_device``, ``set_device``,
  ``get_device_properties`` (``name``, ``gcnArchName``, ``multi_processor_count``,
  ``warp_size``, ``major``/``minor``, ``total_memory``, ``L2_cache_size``),
  ``get_device_name``, ``get_device_capability`` (ROCm reports the gfx major/minor:
  gfx90a -> (9, 0), gfx942 -> (9, 4)), and ``init``/``synchronize`` as no-ops;
* Triton's active driver (``triton.runtime.driver.active`` and its default): a
  :class:`FakeHIPDriver` whose ``get_current_target()`` is ``GPUTarget("hip", arch, 64)``.
  Triton 3.6 builds its default driver from the one backend whose ``is_active()`` is
  true, and ``HIPDriver.is_active()`` is exactly "torch.cuda is available and
  torch.version.hip is set" -- so with the fake torch it would pick HIP and load
  ``libamdhip64`` (absent here). Both the active and the default driver are replaced
  before anything asks for them.

Tensors stay on the CPU and kernels run in Triton's interpreter (``TRITON_INTERPRET=1``);
cross-compiling for the faked arch works as on any machine. ``CUDA``/``HIP`` device
tensors (``device="cuda"``) do not exist under the fake.

Child processes. The tuner's timing and pre-warm workers are spawned Pythons. The
:func:`fake_rocm_env` environment puts ``tests/fake_rocm_site`` (a ``sitecustomize``) on
``PYTHONPATH`` and the fake's parameters in ``ROCMFLASH_FAKE_ROCM``, so every child Python
installs the same fake at start-up. In a child it is installed lazily: torch and Triton
are patched when (and if) they are first imported, so a child that never imports torch
(a static-sweep compile worker) does not pay for importing it.

Device visibility: a child whose ``HIP_VISIBLE_DEVICES``/``CUDA_VISIBLE_DEVICES`` lists
fewer devices than the fake has sees that many (as the HIP runtime would).
"""

from __future__ import annotations

import dataclasses
import importlib.abc
import json
import os
import sys
import types
from typing import Callable, Optional

ENV = "ROCMFLASH_FAKE_ROCM"
SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_rocm_site")
GIB = 1024**3


@dataclasses.dataclass(frozen=True)
class FakeROCm:
    """The device the fake reports (defaults: one MI250 GCD on ROCm 6.4)."""

    name: str = "AMD Instinct MI250X / MI250"
    gcn_arch_name: str = "gfx90a:sramecc+:xnack-"
    multi_processor_count: int = 104
    warp_size: int = 64
    device_count: int = 1
    hip_version: str = "6.4.43482"
    total_memory: int = 64 * GIB
    l2_cache_size: int = 8 * 1024**2

    @property
    def arch(self) -> str:
        """``gfx90a`` from ``gfx90a:sramecc+:xnack-``."""
        return self.gcn_arch_name.split(":")[0]

    @property
    def capability(self) -> tuple[int, int]:
        """What ROCm reports as (major, minor): the gfx version's major and minor digit (gfx90a -> (9, 0))."""
        digits = self.arch[3:]
        return int(digits[:-2]), int(digits[-2], 16)

    def target(self):
        """The Triton target the fake driver reports."""
        from triton.backends.compiler import GPUTarget

        return GPUTarget("hip", self.arch, self.warp_size)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "FakeROCm":
        return cls(**json.loads(text))


def visible_count(fake: FakeROCm, environ=os.environ) -> int:
    """Devices a process sees: the fake's count, narrowed by a HIP/CUDA visibility list (HIP's first)."""
    for var in ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
        if var in environ:
            return min(fake.device_count, len([e for e in environ[var].split(",") if e.strip()]))
    return fake.device_count


# ---------------------------------------------------------------------- patching
class Patches:
    """Attribute patches that can be undone in reverse order."""

    def __init__(self):
        self._undo: list = []

    def set(self, obj, name: str, value) -> None:
        missing = not hasattr(obj, name)
        self._undo.append((obj, name, None if missing else getattr(obj, name), missing))
        setattr(obj, name, value)

    def undo(self) -> None:
        while self._undo:
            obj, name, old, missing = self._undo.pop()
            if missing:
                delattr(obj, name)
            else:
                setattr(obj, name, old)


def _props(fake: FakeROCm):
    major, minor = fake.capability
    return types.SimpleNamespace(
        name=fake.name, gcnArchName=fake.gcn_arch_name, multi_processor_count=fake.multi_processor_count,
        warp_size=fake.warp_size, major=major, minor=minor, total_memory=fake.total_memory,
        L2_cache_size=fake.l2_cache_size, is_integrated=False, is_multi_gpu_board=False)


def patch_torch(torch, fake: FakeROCm, patches: Patches) -> None:
    """Make ``torch`` a ROCm build that sees ``fake``'s devices."""
    state = {"device": 0}

    def count() -> int:  # read at call time: a worker narrows its visibility before it first asks
        return visible_count(fake)

    def check(device=None) -> int:
        if isinstance(device, str):  # "cuda", "cuda:1"
            device = torch.device(device)
        index = getattr(device, "index", device)
        index = state["device"] if index is None else int(index)
        if not 0 <= index < count():
            raise RuntimeError(f"fake ROCm: invalid device ordinal {index} ({count()} visible)")
        return index

    def set_device(device) -> None:
        state["device"] = check(device)

    props = _props(fake)
    patches.set(torch.version, "hip", fake.hip_version)
    patches.set(torch.version, "cuda", None)
    cuda = torch.cuda
    patches.set(cuda, "is_available", lambda: count() > 0)
    patches.set(cuda, "device_count", count)
    patches.set(cuda, "current_device", lambda: state["device"])
    patches.set(cuda, "set_device", set_device)
    patches.set(cuda, "get_device_properties", lambda device=None: (check(device), props)[1])
    patches.set(cuda, "get_device_name", lambda device=None: (check(device), fake.name)[1])
    patches.set(cuda, "get_device_capability", lambda device=None: (check(device), fake.capability)[1])
    patches.set(cuda, "init", lambda: None)  # no runtime to initialise
    patches.set(cuda, "synchronize", lambda device=None: None)  # the interpreter is synchronous


class FakeHIPDriver:
    """Stands in for Triton's ``HIPDriver``: reports the fake target, loads no HIP library."""

    def __init__(self, fake: FakeROCm):
        self.fake = fake
        self.utils = types.SimpleNamespace(get_device_properties=self._properties)

    @staticmethod
    def is_active() -> bool:
        return True

    def get_current_target(self):
        return self.fake.target()

    def get_active_torch_device(self):
        import torch

        return torch.device("cpu")  # kernels run in the interpreter on CPU tensors

    def get_current_device(self) -> int:
        import torch

        return torch.cuda.current_device()

    def set_current_device(self, device) -> None:
        import torch

        torch.cuda.set_device(device)

    def get_current_stream(self, device=None) -> int:
        return 0

    def get_device_capability(self, device=None):
        return self.fake.capability

    def get_device_interface(self):
        import torch

        return torch.cuda

    def map_python_to_cpp_type(self, ty: str) -> str:
        from triton.backends.amd.driver import ty_to_cpp

        return ty_to_cpp(ty)

    def get_benchmarker(self):
        raise NotImplementedError("fake ROCm: no device to benchmark on (time interpreted launches on the CPU)")

    def _properties(self, device=None) -> dict:
        # the keys Triton's compiler and testing helpers read from HIPUtils.get_device_properties
        return {"arch": self.fake.gcn_arch_name, "warpSize": self.fake.warp_size,
                "multiprocessor_count": self.fake.multi_processor_count,
                "max_shared_mem": 64 * 1024, "mem_clock_rate": 1_600_000, "mem_bus_width": 4096}


def patch_triton(triton_module, fake: FakeROCm, patches: Patches) -> None:
    """Make Triton's active (and default) driver the fake HIP driver."""
    from triton.runtime import driver as config

    fake_driver = FakeHIPDriver(fake)
    # DriverConfig builds its default lazily from the active backend (HIP under the fake torch),
    # so both slots are filled: reset_active() must not construct a real HIPDriver either.
    patches.set(config, "_default", fake_driver)
    patches.set(config, "_active", fake_driver)


# ---------------------------------------------------------------------- install
def install(fake: Optional[FakeROCm] = None) -> Patches:
    """Install the fake in this process now (imports torch and triton); returns the patches to undo."""
    import torch
    import triton

    fake = fake or FakeROCm()
    patches = Patches()
    patch_torch(torch, fake, patches)
    patch_triton(triton, fake, patches)
    return patches


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Runs ``hooks[name](module)`` right after top-level module ``name`` is first imported."""

    def __init__(self, hooks: dict):
        self.hooks = dict(hooks)

    def find_spec(self, name, path=None, target=None):
        hook = self.hooks.pop(name, None)
        if hook is None:
            return None
        from importlib.util import find_spec

        spec = find_spec(name)  # the real finders (this one no longer has a hook for name)
        if spec is not None and spec.loader is not None:
            spec.loader = _HookedLoader(spec.loader, hook)
        return spec


class _HookedLoader(importlib.abc.Loader):
    def __init__(self, inner, hook: Callable):
        self._inner, self._hook = inner, hook

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module) -> None:
        self._inner.exec_module(module)
        module.__loader__ = module.__spec__.loader = self._inner  # leave no trace once loaded
        self._hook(module)

    def __getattr__(self, name):  # resource readers etc. of the real loader
        return getattr(self._inner, name)


def install_from_env(environ=os.environ) -> bool:
    """In a child Python (``sitecustomize``): install the fake described by ``$ROCMFLASH_FAKE_ROCM``.

    torch and Triton are patched when they are imported (at once if they already are).
    Returns False when the variable is not set.
    """
    text = environ.get(ENV)
    if not text:
        return False
    fake = FakeROCm.from_json(text)
    patches = Patches()
    hooks = {"torch": lambda mod: patch_torch(mod, fake, patches),
             "triton": lambda mod: patch_triton(mod, fake, patches)}
    for name in list(hooks):
        if name in sys.modules:
            hooks.pop(name)(sys.modules[name])
    if hooks:
        sys.meta_path.insert(0, _PatchOnImport(hooks))
    return True


def fake_rocm_env(fake: FakeROCm, environ=os.environ) -> dict:
    """The variables that make every child Python install ``fake`` and run kernels in the interpreter."""
    path = [SITE_DIR] + [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {ENV: fake.to_json(), "PYTHONPATH": os.pathsep.join(path), "TRITON_INTERPRET": "1"}
