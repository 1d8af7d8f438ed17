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
time :func:`rocmflash.db.lookups.varlen_bwd.lookup_varlen_bwd` serves the measured entry of the same head dim,
dtype, GQA ratio and causal flag with the nearest bucket; a config it serves that was not measured as that build
is first checked to build (:func:`rocmflash.api.build_check.usable_config`). Without a live GPU of the named kind
the static #1 of each kernel is written ``"measured": false`` and never served.
"""

from __future__ import annotations

from typing import Optional

from rocmflash.db.lookups.varlen_bwd import varlen_bwd_key
# task_compile_options: the family's compile options (rocmflash.static.families reads it from this module)
from rocmflash.tuning.backward import BwdStatic, bwd_space, kernel_config, rank_each_kernel, task_compile_options
from rocmflash.tuning.varlen import VarlenProblem


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


__all__ = ["problem_key", "varlen_bwd_space", "compile_task", "task_compile_options", "static_phase"]
