"""``rocmflash vgpr-report --pass bwd``: the backward kernels' register use and pruning for a GPU's arch.

Both backward kernels (dQ, dK/dV) over :func:`rocmflash.tuning.backward.bwd_space`,
cross-compiled for the GPU's arch on this CPU, one row per config: registers, spills,
scratch, LDS and waves read from the code object, the pruner's verdict with its reason,
the static rank among the kernel's survivors, and which config is the per-arch default
that training runs with until a tune on the live GPU writes measured entries.
"""

from __future__ import annotations

from rocmflash.kernels.backward.host import space_point
from rocmflash.static import report_dirs as R
from rocmflash.static.family_report import REGISTER_COLUMNS, publish, register_values
from rocmflash.tuning.backward import KERNELS, BwdStatic, owned_and_looped, static_phase

COLUMNS = ("kernel", "config", *REGISTER_COLUMNS, "verdict", "rank", "default", "reason")
#: the query heads of the report's problem without ``--heads`` (key/value heads: as many)
DEFAULT_HEADS = 16


def label(cfg: dict) -> str:
    own, loop = owned_and_looped(cfg)
    text = f"own {own} loop {loop} w{cfg['num_warps']} s{cfg['num_stages']}"
    return text + (f" wpe{cfg['waves_per_eu']}" if cfg.get("waves_per_eu") else "")


def ordered(static: BwdStatic) -> list:
    """Report order: per kernel (dQ, then dK/dV), the kept rows by rank, then the pruned ones."""
    return [r for k in KERNELS for r in static.ranked(k) + [r for r in static.of(k) if not r["kept"]]]


def row_values(defaults: list):
    """The row -> table values function of a backward report; ``defaults``: the per-arch default's space points."""

    def values(row: dict) -> list:
        return [row["config"]["kernel"], label(row["config"]), *register_values(row["kernel"]),
                "kept" if row["kept"] else "pruned", row["static_rank"] if row["static_rank"] is not None else "-",
                "yes" if row["config"] in defaults else "", row["reason"] or ""]

    return values


def problem_of(args):
    """The report's problem: ``--head-dim``, ``--dtype``, ``--causal``, ``--heads`` (default 16), ``--kv-heads``."""
    from rocmflash.config import Problem

    return Problem(head_dim=args.head_dim, dtype=args.dtype, causal=args.causal,
                   heads_q=args.heads or DEFAULT_HEADS, heads_kv=args.kv_heads or args.heads or DEFAULT_HEADS)


def default_name(gpu, problem) -> str:
    """The report folder's name (:mod:`rocmflash.static.report_dirs`): ``vgpr-bwd-<gpu>-d<D>-<dtype>``, then
    ``-causal`` and the heads when not the defaults (``-heads32-kvheads8``)."""
    return R.folder_name("vgpr-bwd", gpu, problem.head_dim, problem.dtype, R.flag_suffix(problem.causal, "causal"),
                         *R.heads_suffixes(problem.heads_q, problem.heads_kv, DEFAULT_HEADS, problem.heads_q))


def main(args, command: str) -> int:
    from rocmflash.hw.gpus import get_gpu
    from rocmflash.kernels.backward.host import check_head_dim, default_bwd_config

    gpu = get_gpu(args.gpu)
    check_head_dim(args.head_dim)
    problem = problem_of(args)
    static = static_phase(gpu, problem, args.cache_dir, args.workers)
    default = default_bwd_config(gpu.arch, problem.head_dim)
    defaults = [space_point("dkdv", default.dkdv), space_point("dq", default.dq)]

    kept = {k: len(static.ranked(k)) for k in KERNELS}
    header = [f"problem: D={problem.head_dim} {problem.dtype} {'causal' if problem.causal else 'non-causal'}, "
              f"Hq {problem.heads_q} / Hkv {problem.heads_kv}",
              f"{len(static.rows)} configs (dQ {len(static.of('dq'))}, dK/dV {len(static.of('dkdv'))}); kept: dQ "
              f"{kept['dq']}, dK/dV {kept['dkdv']}; registers and occupancy read from the code objects "
              "(`isa_tools`), verdicts from `rocmflash.static.prune`; 'own'/'loop' = the block a program owns / loops over",
              "default = the per-arch default run-time selection uses without a measured entry"]
    out = R.out_dir(args, default_name(gpu, problem))
    publish(out, f"backward kernels on {gpu.name} ({gpu.arch}), cross-compiled", header, COLUMNS, ordered(static),
            row_values(defaults), command, args.json, f"kept {kept['dq']} dQ and {kept['dkdv']} dK/dV configs of "
            f"{len(static.rows)}", max_rows=100)
    return 0
