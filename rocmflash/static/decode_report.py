"""``rocmflash vgpr-report --mode decode``: the decode kernels' register use and pruning for a GPU's arch."""

from __future__ import annotations

import os

from rocmflash.static.family_report import REGISTER_COLUMNS, publish, register_values
from rocmflash.tuning.decode import DecodeProblem, static_phase

COLUMNS = ("config", *REGISTER_COLUMNS, "combine VGPR", "verdict", "rank", "reason")


def label(cfg: dict) -> str:
    text = f"BN{cfg['BLOCK_N']} w{cfg['num_warps']} s{cfg['num_stages']}"
    return text + (f" wpe{cfg['waves_per_eu']}" if cfg.get("waves_per_eu") else "")


def row_values(row: dict) -> list:
    return [label(row["config"]), *register_values(row["kernel"]), row["combine"].get("vgpr_count"),
            "kept" if row["kept"] else "pruned", row["static_rank"] if row["static_rank"] is not None else "-",
            row["reason"] or ""]


def main(args, command: str) -> int:
    from rocmflash.hw.gpus import get_gpu

    gpu = get_gpu(args.gpu)
    problem = DecodeProblem(head_dim=args.head_dim, dtype=args.dtype, heads_q=args.heads or 32,
                            heads_kv=args.kv_heads or 8, batch=args.batch or 32, seqlen_k=args.seqlen or 4096,
                            page_size=args.page_size or 0,
                            kv_dtype=getattr(args, "kv_dtype", None) or "").validate().for_gpu(gpu)
    static = static_phase(gpu, problem, args.cache_dir, args.workers)
    p = problem
    cache = f"{p.kv_dtype} cache" if p.kv_dtype else f"{p.dtype} cache"  # the arch's fp8 format, or 16-bit
    header = [f"problem: D={p.head_dim} {p.dtype}, {cache}, Hq {p.heads_q} / Hkv {p.heads_kv} (GQA {p.group}), "
              f"Sq {p.seqlen_q}, {'paged, page ' + str(p.page_size) if p.page_size else 'contiguous cache'}",
              f"{len(static.rows)} configs, {len(static.ranked)} kept; registers and occupancy read from the "
              "code objects (`isa_tools`), verdicts from `rocmflash.static.prune`"]
    suffix = f"-kv{p.kv_dtype}" if p.kv_dtype else ""  # fp8-cache reports do not overwrite the 16-bit one
    publish(args.out or os.path.join("reports", f"vgpr-decode-{gpu.name}-d{p.head_dim}-{p.dtype}{suffix}"),
            f"decode kernels on {gpu.name} ({gpu.arch}), {cache}, cross-compiled", header, COLUMNS, static.report_order,
            row_values, command, args.json, f"{len(static.ranked)} of {len(static.rows)} decode configs kept")
    return 0
