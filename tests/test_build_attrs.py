"""Launch attributes of a compile-only build, and the observation-cache key they and the environment feed.

A static build must get the attributes a launch of the installed Triton gives (else it is
another binary): Triton 3.6+ asks its backend ``get_tensor_specialization``, Triton 3.4/3.5
``get_arg_specialization(arg, ty)``. On AMD a tensor under 2 GiB gets ``tt.pointer_range = 32``
when buffer ops are on, and its loads become buffer loads (checked in real gfx942 builds).
The environment variables Triton's compiler reads are part of the observation key.
"""

import os
import re

import pytest
import triton
from packaging.version import Version

from rocmflash.static import compile as C
from rocmflash.config import KernelConfig, Problem
from rocmflash.kernels.demo import lds_reduce_kernel
from rocmflash.hw.gpus import get_gpu
from rocmflash.kernels import build
from rocmflash.kernels.build import MAX_32BIT_RANGE, Ptr, as_target, compile_kernel, launch_attributes

#: AMD knobs Triton's make_ttgir reads (pipelining, scheduling, buffer ops): each changes the binary
NAMED_KNOBS = ("TRITON_HIP_USE_ASYNC_COPY", "TRITON_HIP_USE_BLOCK_PINGPONG", "TRITON_HIP_USE_IN_THREAD_TRANSPOSE",
               "AMDGCN_ANALYZE_SMALL_TENSOR_RANGE", "AMDGCN_USE_BUFFER_OPS")
POINTER_RANGE = ["tt.pointer_range", 32]
DIVISIBLE = ["tt.divisibility", 16]


@pytest.fixture
def clean_env(monkeypatch):
    """No build knob set, whatever the calling shell or CI exported."""
    for var in {v for vs in getattr(C, "BUILD_ENV_VARS", {}).values() for v in vs} | set(NAMED_KNOBS):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def _env_on(var: str) -> bool:
    """Triton's reading of a boolean knob (``env_bool``: 1/true/yes/on/y), unset = off as in Triton 3.4/3.5."""
    return os.environ.get(var, "").strip().lower() in ("1", "true", "yes", "on", "y")


class Triton35HIPBackend:
    """What Triton 3.4/3.5's HIPBackend gives its launcher (third_party/amd/backend/compiler.py at v3.4.0 and
    v3.5.0, with BaseBackend's rule inlined): one hook, ``get_arg_specialization(arg, ty, **kwargs)``, no
    ``get_tensor_specialization``; buffer ops only when ``AMDGCN_USE_BUFFER_OPS`` is set (off by default)."""

    def __init__(self):
        self.calls = []

    @staticmethod
    def parse_attr(desc):
        ret = [["tt.divisibility", 16]] if "D" in desc else []
        if "S" in desc:
            ret += [["tt.pointer_range", 32]]
        return ret

    def get_arg_specialization(self, arg, ty, **kwargs):
        self.calls.append((ty, kwargs))
        ret = ""
        if ty == "int" and arg % 16 == 0 and kwargs.get("align", False):
            ret = "D"
        if ty == "tensor" and arg.data_ptr() % 16 == 0 and kwargs.get("align", False):
            ret = "D"
        if _env_on("AMDGCN_USE_BUFFER_OPS") and ty == "tensor" and arg.ptr_range() <= 2**31 - 1:
            ret += "S"
        return ret


def test_triton_35_hook_gives_pointer_range_to_a_tensor_under_2gib(clean_env):
    backend = Triton35HIPBackend()
    clean_env.setattr(build, "_backend", lambda target: backend)
    clean_env.setenv("AMDGCN_USE_BUFFER_OPS", "1")
    pointer_attrs, int_attrs = launch_attributes(as_target("gfx942"))
    assert pointer_attrs(Ptr("*fp16")) == [DIVISIBLE, POINTER_RANGE]
    assert pointer_attrs(Ptr("*fp16", MAX_32BIT_RANGE + 1)) == [DIVISIBLE]  # over 2 GiB: 64-bit offsets
    assert int_attrs(True) == [DIVISIBLE] and int_attrs(False) == []
    assert {ty for ty, _ in backend.calls} == {"tensor", "int"}
    assert all(kwargs == {"align": True} for _, kwargs in backend.calls)  # as the launcher asks
    clean_env.delenv("AMDGCN_USE_BUFFER_OPS")  # 3.4/3.5's default: global loads
    assert pointer_attrs(Ptr("*fp16")) == [DIVISIBLE]


def test_triton_35_attributes_change_the_observation_key(clean_env):
    """The attributes a 3.4/3.5 launch gets are in the key itself (not only the variable that moved them)."""
    clean_env.setattr(build, "_backend", lambda target: Triton35HIPBackend())
    gpu = get_gpu("mi300x")
    clean_env.setenv("AMDGCN_USE_BUFFER_OPS", "1")
    buffer_loads = C._target_key(gpu)
    clean_env.setenv("AMDGCN_USE_BUFFER_OPS", "0")
    global_loads = C._target_key(gpu)
    assert POINTER_RANGE in buffer_loads[3][0] and POINTER_RANGE not in global_loads[3][0]


def test_a_backend_without_either_hook_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(build, "_backend", lambda target: type("OldBackend", (), {"parse_attr": staticmethod(str)})())
    with pytest.raises(TypeError, match="get_tensor_specialization .* get_arg_specialization"):
        launch_attributes(as_target("gfx942"))


def _buffer_ops_default() -> bool:
    """Triton turned AMD buffer ops on by default in 3.6."""
    return Version(triton.__version__).release >= (3, 6)


def _build_reduce(target, monkeypatch, tmp_path, tag: str):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / tag))
    return compile_kernel(lds_reduce_kernel, target, {"x_ptr": Ptr("*fp32"), "y_ptr": Ptr("*fp32"), "n": 4096},
                          {"BLOCK": 256}, KernelConfig())


def _loads(kernel) -> set:
    return set(re.findall(r"\b(buffer_load|global_load)_\w+", kernel.asm["amdgcn"]))


@pytest.mark.parametrize("setting, buffer_ops", [(None, _buffer_ops_default()), ("1", True), ("0", False)])
def test_installed_triton_gfx942_attributes_key_and_binary(clean_env, tmp_path, setting, buffer_ops):
    """The installed Triton's own AMD backend: pointer_range 32 exactly when buffer ops are on, the real
    gfx942 build's loads follow (buffer loads vs global loads), and the key's attributes differ per setting."""
    if setting is not None:
        clean_env.setenv("AMDGCN_USE_BUFFER_OPS", setting)
    pointer_attrs, _ = launch_attributes(as_target("gfx942"))
    assert (POINTER_RANGE in pointer_attrs(Ptr("*fp16"))) is buffer_ops
    assert POINTER_RANGE not in pointer_attrs(Ptr("*fp16", MAX_32BIT_RANGE + 1))
    assert _loads(_build_reduce("gfx942", clean_env, tmp_path, "build")) == ({"buffer_load"} if buffer_ops
                                                                               else {"global_load"})
    gpu = get_gpu("mi300x")
    key, target_key = C.fingerprint(KernelConfig(), Problem(), gpu), C._target_key(gpu)
    clean_env.setenv("AMDGCN_USE_BUFFER_OPS", "0" if buffer_ops else "1")
    assert C.fingerprint(KernelConfig(), Problem(), gpu) != key
    assert C._target_key(gpu)[3] != target_key[3]  # the attributes themselves, not only the variable


# ---------------------------------------------------------------------- build environment in the key
#: knobs the installed AMD compiler reads that do not change the code object (dumps, timing, tool paths, hooks)
NOT_BUILD_KNOBS = {"dump_amdgcn", "dump_mir", "dump_ir", "libhip_path", "lld_path", "add_stages_inspection_hook"}
NOT_BUILD_ENV_VARS = {"LLVM_IR_ENABLE_DUMP", "LLVM_ENABLE_TIMING", "AMDGCN_ENABLE_DUMP"}


def test_named_knobs_are_build_env_vars():
    assert set(NAMED_KNOBS) <= set(C.BUILD_ENV_VARS["hip"])


class _Family:
    """The parts of a :class:`rocmflash.static.families.Family` its cache key reads."""

    name = "probe"

    @staticmethod
    def source_hash():
        return "source"

    @staticmethod
    def compile_options(config, backend):
        return {"num_warps": 4}


@pytest.mark.parametrize("var", C.BUILD_ENV_VARS["hip"] if hasattr(C, "BUILD_ENV_VARS") else NAMED_KNOBS)
def test_each_build_env_var_changes_the_key(clean_env, var):
    """Each knob changes the AMD keys (forward and family); an AMD-only knob leaves the NVIDIA key alone."""
    amd, nvidia = get_gpu("mi300x"), get_gpu("h100")

    def keys():
        return (C.fingerprint(KernelConfig(), Problem(), amd), C.family_fingerprint(_Family, {"x": 1}, {}, amd),
                C.fingerprint(KernelConfig(), Problem(), nvidia))

    unset = keys()
    for value in ("1", "0"):
        clean_env.setenv(var, value)
        changed = keys()
        assert changed[0] != unset[0] and changed[1] != unset[1]
        assert (changed[2] != unset[2]) is (var in C.BUILD_ENV_VARS["cuda"])
    clean_env.delenv(var)
    assert keys() == unset


def _knob_env_vars(knobs, group: str, name: str) -> set:
    """The environment variables behind ``knobs.<group>.<name>``: a variable knob's own, or (a knob method,
    as Triton 3.9's ``fp_fusion_enabled``) those of the knobs and ``getenv`` calls its source reads."""
    import inspect

    cls = type(getattr(knobs, group))
    attr = cls.__dict__.get(name)
    if hasattr(attr, "key"):
        return {attr.key}
    assert callable(attr), f"knobs.{group}.{name}: neither an environment variable nor a method"
    source = inspect.getsource(attr)
    found = set(re.findall(r"getenv\w*\(\s*[\"'](\w+)", source))
    for other in set(re.findall(r"self\.(\w+)", source)) - {name}:
        found |= _knob_env_vars(knobs, group, other)
    assert found, f"knobs.{group}.{name}: reads no environment variable this test can see"
    return found


def test_every_binary_knob_the_installed_amd_compiler_reads_is_in_the_key():
    """Read the installed Triton's AMD compiler: each ``knobs.<group>.<name>`` it consults maps to the
    environment variables behind it, and it may read some directly (``getenv``); all but dumps, paths and
    hooks must be in ``BUILD_ENV_VARS["hip"]`` (so a knob a new Triton adds fails here)."""
    from triton import knobs
    from triton.backends.amd import compiler

    with open(compiler.__file__, encoding="utf-8") as f:
        source = f.read()
    used = set(re.findall(r"knobs\.(amd|runtime|language|compilation)\.(\w+)", source))
    assert len(used) > 5  # the pattern still finds Triton's knob reads
    env_vars = {var: f"knobs.{group}.{name}" for group, name in used if name not in NOT_BUILD_KNOBS
                for var in _knob_env_vars(knobs, group, name)}
    for var in re.findall(r"(?:getenv\w*|environ\.get)\(\s*[\"'](\w+)", source):
        env_vars.setdefault(var, "read directly")
    missing = {var: knob for var, knob in env_vars.items()
               if var not in C.BUILD_ENV_VARS["hip"] and var not in NOT_BUILD_ENV_VARS}
    assert not missing, missing


# ---------------------------------------------------------------------- arch as a device reports it
@pytest.mark.parametrize("reported", ["gfx942:sramecc+:xnack-", "GFX942:sramecc-", "gfx942"])
def test_arch_with_feature_suffix_is_its_base_target_and_compiles(monkeypatch, tmp_path, reported):
    from triton.backends.compiler import GPUTarget

    target = as_target(reported)
    assert (target.backend, target.arch, target.warp_size) == ("hip", "gfx942", 64)
    assert as_target(GPUTarget("hip", reported, 64)).arch == "gfx942"
    kernel = _build_reduce(reported, monkeypatch, tmp_path, "suffix")
    assert kernel.metadata.target.arch == "gfx942"
    assert re.search(r'\.amdgcn_target "[^"]*-gfx942(:[^"]*)?"', kernel.asm["amdgcn"])
