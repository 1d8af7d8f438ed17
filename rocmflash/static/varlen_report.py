"""``rocmflash vgpr-report --mode varlen [--pass bwd]``: the packed kernels' register use and pruning for a GPU's arch.

``--pass fwd`` (default): the packed forward over the dense online space. ``--pass bwd``: the packed
backward's dQ and dK/dV kernels over the dense backward's space, cross-compiled as the varlen kernels,
with the rows of the dense backward's report (:mod:`rocmflash.static.bwd_report`): registers, spills,
scratch, LDS, waves, the pruner's verdict and reason, the static rank, and which row is the config the
varlen backward serves without a ``varlen-bwd-`` entry (the per-arch default).
"""

from __future__ import annotations

from rocmflash.static import report_dirs as R
from rocmflash.static.family_report import REGISTER_COLUMNS, publish, register_values
from rocmflash.tuning.varlen import VarlenProblem, config_label, static_phase

COLUMNS = ("config", *REGISTER_COLUMNS, "verdict", "rank", "reason")


def row_values(row: dict) -> list:
    return [config_label(row["config"]), *register_values(row["kernel"]), "kept" if row["kept"] else "pruned",
            row["static_rank"] if row["static_rank"] is not None else "-", row["reason"] or ""]


def default_heads(head_dim: int) -> int:
    """The query heads of the report's problem without ``--heads``: ``2048 // D`` (key/value heads: as many)."""
    return max(1, 2048 // max(head_dim, 1))


def problem_of(args) -> VarlenProblem:
    """The report's problem. Lengths are runtime values of the kernel: the compile (and so this report) depends
    on the geometry only."""
    heads = args.heads if args.heads is not None else default_heads(args.head_dim)
    return VarlenProblem.spread(args.batch or 8, args.seqlen or 4096, head_dim=args.head_dim, dtype=args.dtype,
                                heads_q=heads, heads_kv=args.kv_heads if args.kv_heads is not None else heads,
                                causal=args.causal)


def default_name(gpu, p: VarlenProblem, prefix: str = "vgpr-varlen") -> str:
    """The report folder's name (:mod:`rocmflash.static.report_dirs`): ``<prefix>-<gpu>-d<D>-<dtype>``, then
    ``-causal`` and the heads when not the defaults. ``prefix``: ``vgpr-varlen-bwd`` for ``--pass bwd``."""
    return R.folder_name(prefix, gpu, p.head_dim, p.dtype, R.flag_suffix(p.causal, "causal"),
                         *R.heads_suffixes(p.heads_q, p.heads_kv, default_heads(p.head_dim), p.heads_q))


def main(args, command: str) -> int:
    from rocmflash.hw.gpus import get_gpu

    gpu = get_gpu(args.gpu)
    problem = p = problem_of(args)
    geometry = (f"problem: D={p.head_dim} {p.dtype}, Hq {p.heads_q} / Hkv {p.heads_kv} (GQA {p.group}), "
                f"{'causal' if p.causal else 'full'}")
    if getattr(args, "pass_", "fwd") == "bwd":
        return _backward(args, command, gpu, problem, geometry)
    static = static_phase(gpu, problem, args.cache_dir, args.workers)
    header = [f"{geometry}; the packed forward (`flash_attn_varlen_func`), LSE stored",
              f"{len(static.rows)} configs (the dense online space), {len(static.ranked)} kept; registers and "
              "occupancy read from the code objects (`isa_tools`), verdicts from `rocmflash.static.prune`"]
    publish(R.out_dir(args, default_name(gpu, p)),
            f"varlen forward kernel on {gpu.name} ({gpu.arch}), cross-compiled", header, COLUMNS, static.report_order,
            row_values, command, args.json, f"{len(static.ranked)} of {len(static.rows)} varlen configs kept")
    return 0


def _backward(args, command: str, gpu, problem: VarlenProblem, geometry: str) -> int:
    from rocmflash.kernels.backward.host import default_bwd_config, space_point
    from rocmflash.static import bwd_report
    from rocmflash.tuning.backward import KERNELS
    from rocmflash.tuning.varlen_bwd import static_phase as bwd_static_phase

    static = bwd_static_phase(gpu, problem, args.cache_dir, args.workers)
    default = default_bwd_config(gpu.arch, problem.head_dim)
    defaults = [space_point("dkdv", default.dkdv), space_point("dq", default.dq)]
    kept = {k: len(static.ranked(k)) for k in KERNELS}
    header = [f"{geometry}; the packed backward (`flash_attn_varlen_func`'s dQ and dK/dV kernels)",
              f"{len(static.rows)} configs (the dense backward's space: dQ {len(static.of('dq'))}, dK/dV "
              f"{len(static.of('dkdv'))}); kept: dQ {kept['dq']}, dK/dV {kept['dkdv']}; registers and occupancy "
              "read from the code objects (`isa_tools`), verdicts from `rocmflash.static.prune`; 'own'/'loop' = the block "
              "a program owns / loops over",
              "default = the per-arch default the varlen backward serves without a measured varlen-bwd or bwd entry"]
    out = R.out_dir(args, default_name(gpu, problem, "vgpr-varlen-bwd"))
    publish(out, f"varlen backward kernels on {gpu.name} ({gpu.arch}), cross-compiled", header, bwd_report.COLUMNS,
            bwd_report.ordered(static), bwd_report.row_values(defaults), command, args.json,
            f"kept {kept['dq']} dQ and {kept['dkdv']} dK/dV varlen configs of {len(static.rows)}", max_rows=100)
    return 0
