"""rocmflash: tune Triton FlashAttention kernels for AMD wave-64 GPUs from compiler truth.

``import rocmflash`` is cheap: the attention API (which imports torch and triton)
is loaded on first use of ``rocmflash.attention`` / ``rocmflash.flash_attn_func`` /
``rocmflash.flash_attn_varlen_func`` / ``rocmflash.flash_attn_with_kvcache`` / ``rocmflash.patch_sdpa``, and of
flash-attn 2's packed forms (``rocmflash.flash_attn_qkvpacked_func`` and the like): flash-attn 2.8's names and
signatures, so ``import rocmflash as flash_attn`` serves code written for it. flash-attn 3's interface is the module
:mod:`rocmflash.flash_attn_interface`.
The custom ops ``torch.ops.rocmflash.*`` (:mod:`rocmflash.api.ops`) work right after ``import rocmflash``
too, whether torch was imported before or after it: their module is imported on the first lookup. So does
the name ``"rocmflash"`` in torch's flash attention registry, where the torch has one
(``torch.nn.attention.activate_flash_attention_impl("rocmflash")``, :mod:`rocmflash.api.sdpa_registry`).

``rocmflash.check_errors(device=None)`` (:mod:`rocmflash.api.errors`) raises one ``ValueError`` naming every
value the varlen, decode and fp8 kernels had to clamp since the last report, and clears the reports.
"""

import sys

from rocmflash._version import __version__  # noqa: E402

_LAZY = {"attention": "rocmflash.api.attention", "flash_attn_func": "rocmflash.api.attention",
         "flash_attn_varlen_func": "rocmflash.api.varlen", "flash_attn_with_kvcache": "rocmflash.api.decode",
         "patch_sdpa": "rocmflash.api.sdpa", "unpatch_sdpa": "rocmflash.api.sdpa",
         "check_errors": "rocmflash.api.errors",
         "flash_attn_qkvpacked_func": "rocmflash.api.packed", "flash_attn_kvpacked_func": "rocmflash.api.packed",
         "flash_attn_varlen_qkvpacked_func": "rocmflash.api.packed",
         "flash_attn_varlen_kvpacked_func": "rocmflash.api.packed"}

#: the modules that register ``torch.ops.rocmflash.*`` when imported
_OP_MODULES = ("rocmflash.api.ops",)


def __getattr__(name):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # later lookups are plain attribute reads (no per-call import machinery)
        return value
    raise AttributeError(f"module 'rocmflash' has no attribute {name!r}")


def _install_op_namespace(torch) -> None:
    """Make ``torch.ops.rocmflash`` import :data:`_OP_MODULES` on its first unknown attribute.

    Importing :mod:`rocmflash.api.ops` eagerly would cost every ``import rocmflash`` torch and
    Triton (and the CLI's CPU-only commands a version check); instead the ``torch.ops``
    namespace object, which torch creates on first access and caches as an attribute, is
    made lazy: ``torch.ops.rocmflash.attn_fwd`` imports the op modules, then looks again.
    """
    import importlib

    ops = getattr(torch, "ops", None)
    base = getattr(getattr(torch, "_ops", None), "_OpNamespace", None)
    if ops is None or base is None or all(m in sys.modules for m in _OP_MODULES):
        return  # an unknown torch layout, or the ops are registered already: nothing to make lazy

    class _LazyOpNamespace(base):
        # torch names each op's module after its namespace object's ``__module__`` ("torch._ops.rocmflash"),
        # and Inductor finds ops again by that name: it must be torch's, not this module's
        __module__ = base.__module__

        def __getattr__(self, op_name):
            if not op_name.startswith("__"):
                for module in _OP_MODULES:
                    importlib.import_module(module)  # registers the ops; its errors are the user's answer
                self.__class__ = base  # registered now: lookups are torch's own from here on
            return base.__getattr__(self, op_name)

    namespace = ops.__dict__.get("rocmflash")
    if namespace is None:
        setattr(ops, "rocmflash", _LazyOpNamespace("rocmflash"))  # what torch.ops.__getattr__ would cache
        if isinstance(getattr(ops, "_dir", None), list):
            ops._dir.append("rocmflash")  # as torch.ops.__getattr__ does, for dir(torch.ops)
    elif type(namespace) is base:
        namespace.__class__ = _LazyOpNamespace  # someone looked before importing rocmflash: keep that object


def _after_torch_import(torch) -> None:
    """What ``import rocmflash`` does to torch once both are imported: the lazy op namespace, and the name
    ``"rocmflash"`` in torch's flash attention registry (a dict entry; the kernels load on activation)."""
    _install_op_namespace(torch)
    from rocmflash.api.sdpa_registry import register_with_torch  # torch-free module: no import cost

    try:
        register_with_torch(torch)
    except Exception as err:  # a registry of another shape: patch_sdpa still works; import must not fail
        import warnings

        warnings.warn(f"rocmflash: could not register with torch's flash attention registry ({err}); "
                      "rocmflash.patch_sdpa() still routes SDPA", RuntimeWarning, stacklevel=2)


class _AfterTorchImport:
    """A one-shot ``sys.meta_path`` finder: when ``torch`` is imported after rocmflash, install the lazy
    op namespace right after torch's module has run (Python has no post-import hook of its own)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torch":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec("torch")  # the finders after this one, as the import would ask them
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _install_after(spec.loader)
        return spec


def _install_after(inner):
    """A loader that runs ``inner`` and then :func:`_after_torch_import`, and leaves no trace once loaded."""
    import importlib.abc

    class _Loader(importlib.abc.Loader):
        def create_module(self, spec):
            return inner.create_module(spec)

        def exec_module(self, module):
            inner.exec_module(module)
            module.__loader__ = module.__spec__.loader = inner
            try:
                _after_torch_import(module)
            except Exception:  # a torch whose ops look different: the ops then need `import rocmflash.api.ops`,
                pass           # but `import torch` itself must never fail because of rocmflash

        def __getattr__(self, name):  # anything else a loader is asked (resources, source): the real one's
            return getattr(inner, name)

    return _Loader()


if "torch" in sys.modules:
    _after_torch_import(sys.modules["torch"])
elif not any(isinstance(f, _AfterTorchImport) for f in sys.meta_path):
    sys.meta_path.insert(0, _AfterTorchImport())


__all__ = ["attention", "flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache",
           "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func", "flash_attn_varlen_qkvpacked_func",
           "flash_attn_varlen_kvpacked_func", "patch_sdpa", "unpatch_sdpa", "check_errors", "__version__"]
