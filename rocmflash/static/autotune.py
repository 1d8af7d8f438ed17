"""Plug the static pruner into ``triton.autotune``.

>>> @triton.autotune(configs=[triton.Config({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=4, num_stages=1), ...],
...                  key=["SEQ_K"],
...                  prune_configs_by={"early_config_prune": rocmflash.static.autotune.early_config_prune(gpu="mi300x")})
... @triton.jit
... def my_attention(Q, K, V, ...): ...  # doctest: +SKIP

The hook cross-compiles rocmflash's kernel of the given variant for each candidate
(cached, so only the first call per problem compiles), reads the code objects and
returns the configs the pruner keeps (never an empty list). The problem (head dim,
dtype, heads, lengths) is read from the first 4-D tensor argument named ``Q``/``q``
in ``(B, H, S, D)`` layout unless given explicitly. A config the GPU's arch and the
installed Triton cannot build as asked (``kpack=2`` on gfx950; see
:meth:`rocmflash.config.KernelConfig.validate`) is dropped with a warning naming it, and
of configs that compile to one code object only the first kept one is returned.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Optional

from rocmflash.config import KernelConfig, Problem, installed_triton_version
from rocmflash.hw.detect import detect_live_gpu
from rocmflash.hw.gpus import GPU, get_gpu
from rocmflash.static.compile import sweep
from rocmflash.static.prune import PruneSettings, prune

_FIELDS = {f.name for f in dataclasses.fields(KernelConfig)}


def kernel_config_from_triton(config, variant: str = "online", arch: Optional[str] = None,
                              triton_version: Optional[str] = None) -> KernelConfig:
    """A :class:`KernelConfig` from a ``triton.Config`` (its kwargs plus num_warps/num_stages).

    Kwargs that are not KernelConfig fields (a user kernel's own constexprs) are ignored;
    AMD options given as kwargs (``waves_per_eu``, ``matrix_instr_nonkdim``, ``kpack``,
    ``schedule_hint``) are honoured. ``arch``/``triton_version``: also reject what that target
    and Triton cannot build as asked (:meth:`KernelConfig.validate`), e.g. ``kpack=2`` on gfx950.
    """
    fields = {k: v for k, v in dict(config.kwargs).items() if k in _FIELDS}
    fields.update(num_warps=config.num_warps, num_stages=config.num_stages, variant=variant)
    return KernelConfig(**fields).validate(arch=arch, triton_version=triton_version)


def problem_from_args(named_args: dict, causal: bool = False) -> Problem:
    """The attention problem from a kernel call's arguments (``Q`` and ``K`` tensors, (B, H, S, D))."""
    q = named_args.get("Q", named_args.get("q"))
    k = named_args.get("K", named_args.get("k"), )
    if q is None or getattr(q, "ndim", 0) != 4:
        raise ValueError("early_config_prune: no 4-D (B, H, S, D) tensor argument named Q or q; "
                         "pass problem=rocmflash.config.Problem(...) explicitly")
    k = q if k is None or getattr(k, "ndim", 0) != 4 else k
    return Problem(head_dim=int(q.shape[3]), dtype=str(q.dtype), causal=causal, batch=int(q.shape[0]),
                   heads_q=int(q.shape[1]), heads_kv=int(k.shape[1]), seqlen_q=int(q.shape[2]),
                   seqlen_k=int(k.shape[2]))


def early_config_prune(gpu: Optional[str] = None, problem: Optional[Problem] = None, variant: str = "online",
                       settings: PruneSettings = PruneSettings(), cache_dir: Optional[str] = None,
                       workers: Optional[int] = None, causal: bool = False):
    """A ``prune_configs_by["early_config_prune"]`` function for ``triton.autotune``.

    ``gpu`` is a catalog name; None means the live device (if none is found, the
    configs are returned unpruned: there is nothing to compile for).
    """
    target: Optional[GPU] = get_gpu(gpu) if gpu else None

    def prune_configs(configs, named_args, **kwargs):
        device = target or detect_live_gpu()
        if device is None:
            return list(configs)
        prob = problem or problem_from_args(named_args, causal=causal)
        usable, kernel_configs = _buildable(configs, variant, device.arch)
        observations, _ = sweep(kernel_configs, prob, device, cache_dir=cache_dir, workers=workers)
        return [c for c, verdict in zip(usable, prune(observations, settings)) if verdict.kept]

    return prune_configs


def _buildable(configs, variant: str, arch: str) -> tuple[list, list]:
    """``(triton configs, KernelConfigs)`` of those the arch and the installed Triton can build as asked.

    The others are dropped with one warning naming each and why (on gfx950 Triton 3.5+ would
    silently run ``kpack=2`` as ``kpack=1``, a duplicate of the kpack=1 config; 3.4 fails to
    compile it). None buildable: ValueError, since there is nothing left to autotune.
    """
    version = installed_triton_version()
    usable, kernel_configs, dropped = [], [], []
    for c in configs:
        try:
            kernel_configs.append(kernel_config_from_triton(c, variant, arch, version))
        except ValueError as err:
            dropped.append(f"{c}: {err}")
            continue
        usable.append(c)
    if dropped and not usable:
        raise ValueError(f"early_config_prune: no config can be built for {arch} with Triton {version}; "
                         f"first: {dropped[0]}")
    if dropped:
        warnings.warn(f"rocmflash early_config_prune: dropped {len(dropped)} config(s) {arch} cannot build as "
                      f"asked: " + "; ".join(dropped), RuntimeWarning, stacklevel=3)
    return usable, kernel_configs
