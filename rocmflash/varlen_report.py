"""``rocmflash vgpr-report --mode varlen``: the packed forward kernel's register use and pruning for a GPU's arch."""

from __future__ import annotations

import os

from rocmflash.family_report import REGISTER_COLUMNS, publish, register_values
from rocmflash.tuning.varlen import VarlenProblem, config_label, static_phase

COLUMNS = ("config", *REGISTER_COLUMNS, "verdict", "rank", "reason")


def row_values(row: dict) -> list:
    return [config_label(row["config"]), *register_values(row["kernel"]), "kept" if row["kept"] else "pruned",
            row["static_rank"] if row["static_rank"] is not None else "-", row["reason"] or ""]


def main(args, command: str) -> int:
    from rocmflash.gpus import get_gpu

    gpu = get_gpu(args.gpu)
    heads = args.heads if args.heads is not None else max(1, 2048 // max(args.head_dim, 1))
    # lengths are runtime values of the kernel: the compile (and so this report) depends on the geometry only
    problem = VarlenProblem.spread(args.batch or 8, args.seqlen or 4096, head_dim=args.head_dim, dtype=args.dtype,
                                   heads_q=heads, heads_kv=args.kv_heads if args.kv_heads is not None else heads,
                                   causal=args.causal)
    static = static_phase(gpu, problem, args.cache_dir, args.workers)
    p = problem
    header = [f"problem: D={p.head_dim} {p.dtype}, Hq {p.heads_q} / Hkv {p.heads_kv} (GQA {p.group}), "
              f"{'causal' if p.causal else 'full'}; the packed forward (`flash_attn_varlen_func`), LSE stored",
              f"{len(static.rows)} configs (the dense online space), {len(static.ranked)} kept; registers and "
              "occupancy read from the code objects (`isa_tools`), verdicts from `rocmflash.prune`"]
    publish(args.out or os.path.join("reports", f"vgpr-varlen-{gpu.name}-d{p.head_dim}-{p.dtype}"),
            f"varlen forward kernel on {gpu.name} ({gpu.arch}), cross-compiled", header, COLUMNS, static.report_order,
            row_values, command, args.json, f"{len(static.ranked)} of {len(static.rows)} varlen configs kept")
    return 0
