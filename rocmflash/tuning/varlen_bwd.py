"""``rocmflash tune --mode varlen --pass bwd``: tune the packed backward's dQ and dK/dV kernels.

``flash_attn_varlen_func``'s backward is two launches of its own kernels
(:mod:`rocmflash.kernels.varlen.host`: ``_varlen_bwd_dq``, which also writes ``delta``, then
``_varlen_bwd_dkdv``), over the same packed workload as the forward: lengths read from
``cu_seqlens``, a grid sized by the longest sequence, programs past a sequence's end returning
at once. Without this tune it took the dense problem's ``bwd-`` entry or the per-arch default.

The space is the dense backward's (:func:`rocmflash.tuning.backward.bwd_space`: per kernel the
block a program owns, the block it loops over, warps, stages and, on AMD, ``waves_per_eu``),
cross-compiled for the target on the CPU *as the varlen kernels* and pruned per kernel on
compiler truth exactly as the dense backward tune prunes
(:func:`rocmflash.tuning.backward.rank_each_kernel`: spills, LDS, occupancy, cliffs, duplicate
binaries, a reason per rejection). On a live GPU of the named kind every survivor, and the
config the backward served before, is gated against an fp32 reference gradient on the packed
batch of :class:`~rocmflash.tuning.varlen.VarlenProblem` and timed
(:mod:`rocmflash.tuning.varlen_bwd_worker`); each kernel's best is kept (their times add up).
The varlen dK/dV kernel sums the whole GQA group in registers: there is no ``head_splits``.

Entries: ``varlen-bwd-d{D}-{dtype}-gqa{G}[-causal]-s{bucket}`` with ``"mode": "varlen"`` and
``"pass": "bwd"``; the dense forward, dense backward, decode and varlen forward lookups skip them
(their keys parse as none of theirs; ``export`` and ``archive/reports:bench/db_truth.py`` skip the mode). At run
time :func:`lookup_varlen_bwd` serves the measured entry of the same head dim, dtype, GQA ratio
and causal flag with the nearest bucket. Without a live GPU of the named kind the static #1 of
each kernel is written ``"measured": false`` and never served.
"""

from __future__ import annotations

import functools
from typing import Optional

from rocmflash.tuning.backward import (BwdStatic, bwd_space, entry_config, kernel_config, rank_each_kernel,
                                       task_compile_options)
from rocmflash.tuning.varlen import VarlenMatch, VarlenProblem, nearest_entry, parse_varlen_key, varlen_key
# the entry keys and the run-time lookup live on the run-time side (rocmflash.db.lookups)
from rocmflash.db.lookups.varlen_bwd import (PREFIX, varlen_bwd_key, parse_varlen_bwd_key, lookup_varlen_bwd,
                                            clear_cache)  # noqa: F401


def problem_key(problem: VarlenProblem) -> str:
    """The entry key of a packed problem's backward."""
    return varlen_bwd_key(problem.head_dim, problem.dtype, problem.group, problem.causal, problem.max_seqlen)


# ----------------------------------------------------------------------------- space, compile, static phase
def varlen_bwd_space(arch: str, head_dim: int) -> list:
    """The dense backward's space of the arch (:func:`~rocmflash.tuning.backward.bwd_space`): the varlen
    kernels take the same knobs (owned and looped block, warps, stages, AMD ``waves_per_eu``)."""
    return bwd_space(arch, head_dim)


def compile_task(target, config: dict, problem: dict):
    """Family entry for :func:`rocmflash.static.compile.sweep_family`: the named varlen backward kernel for ``target``
    (``problem``: :meth:`VarlenProblem.compile_dict`, optionally with ``softcap``/``window`` flags for the
    builds a soft-capped or left-windowed call runs; its ``tokens``, when there, size the tensors)."""
    from rocmflash.kernels.varlen.host import compile_backward_kernel_for

    return (compile_backward_kernel_for(target, config["kernel"], kernel_config(config), problem["head_dim"],
                                        problem["dtype"], problem["group"], problem["causal"], problem["heads_kv"],
                                        problem.get("softcap", False), problem.get("window", False),
                                        problem.get("tokens", 0)),)


def static_phase(gpu, problem: VarlenProblem, cache_dir=None, workers=None, settings=None,
                 configs: Optional[list] = None) -> BwdStatic:
    """Cross-compile the space for ``gpu``'s arch as the varlen dQ and dK/dV kernels, prune and rank each
    kernel's configs as the dense backward tune does (no GPU). ``configs`` replaces the default space."""
    from rocmflash.static.compile import sweep_family

    configs = configs if configs is not None else varlen_bwd_space(gpu.arch, problem.head_dim)
    observations, stats = sweep_family("varlen_bwd", configs, problem.compile_dict(), gpu, cache_dir, workers)
    return BwdStatic(problem, rank_each_kernel(gpu, configs, observations, settings), stats)


# ----------------------------------------------------------------------------- run-time lookup


# ----------------------------------------------------------------------------- run-time compile check
#: the pruner's rules a config must pass as a varlen build to be served: it compiles, spills nothing that costs
#: every loop iteration, fits the LDS/shared memory (the occupancy rules judge speed, which a measurement did)
BUILD_RULES = ("compile_failed", "spills", "lds_over_budget")


def build_problem(head_dim: int, dtype, group: int, causal: bool, softcap: bool = False,
                  window: bool = False) -> dict:
    """The compile problem of a varlen backward call (:func:`compile_task`'s ``problem``): ``heads_kv`` 8 as
    the register studies of :mod:`rocmflash.kernels.varlen.host` build them (it only sets strides); without a cap
    or a window, the :meth:`VarlenProblem.compile_dict` of such a problem (a tune's cached builds serve)."""
    from rocmflash.config import normalize_dtype

    problem = {"head_dim": int(head_dim), "dtype": normalize_dtype(dtype), "group": int(group), "heads_kv": 8,
               "causal": bool(causal)}
    return dict(problem, **{name: True for name, on in (("softcap", softcap), ("window", window)) if on})


def build_rejection(gpu, kernel: str, cfg, problem: dict, cache_dir=None) -> Optional[str]:
    """Why ``cfg`` (a :class:`KernelConfig`) must not run as the varlen ``kernel`` (``"dq"``/``"dkdv"``) on
    ``gpu``'s arch for ``problem`` (:func:`build_problem`), or None: cross-compiled in this process (or read
    from the static phase's cache) and judged by :data:`BUILD_RULES`."""
    from rocmflash.static import prune
    from rocmflash.static.compile import observe_family_config
    from rocmflash.tuning.backward import space_point

    obs = observe_family_config("varlen_bwd", space_point(kernel, cfg), problem, gpu, cache_dir)
    rules = dict(prune.RULES)
    for reason in BUILD_RULES:
        detail = rules[reason](obs, prune.PruneSettings())
        if detail is not None:
            return f"{reason}: {detail}"
    return None


def usable_config(gpu_name: str, cfg, fallback, problem: dict, cache_dir=None) -> tuple:
    """``(config, replaced)``: ``cfg`` (a ``BwdConfig``) with each kernel whose varlen build
    :func:`build_rejection` rejects on ``gpu_name``'s arch replaced by ``fallback``'s (the per-arch default);
    ``replaced`` maps such kernels to the reason. Kernels equal to the fallback's are not compiled. A check
    that cannot run (no compiler for the arch here, an unreadable code object) replaces the kernel too:
    only configs known to build are served."""
    import dataclasses

    from rocmflash.hw.gpus import get_gpu
    from rocmflash.tuning.live_worker import error_line

    gpu = get_gpu(gpu_name)
    replaced = {}
    for kernel in ("dq", "dkdv"):
        mine, safe = getattr(cfg, kernel), getattr(fallback, kernel)
        if mine == safe:
            continue
        try:
            why = build_rejection(gpu, kernel, mine, problem, cache_dir)
        except Exception as err:  # the check itself failed: do not serve what was not checked
            why = f"build check failed: {error_line(err, 200)}"
        if why is not None:
            replaced[kernel] = why
            cfg = dataclasses.replace(cfg, **{kernel: safe})
    return cfg, replaced


__all__ = ["PREFIX", "varlen_bwd_key", "parse_varlen_bwd_key", "problem_key", "varlen_bwd_space", "compile_task",
           "task_compile_options", "static_phase", "lookup_varlen_bwd", "build_problem", "build_rejection",
           "usable_config", "BUILD_RULES", "clear_cache"]
