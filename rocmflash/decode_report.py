"""``rocmflash vgpr-report --mode decode``: the decode kernels' register use and pruning for a GPU's arch."""

from __future__ import annotations

import datetime
import json
import os

from rocmflash.tuning.decode import DecodeProblem, DecodeStatic, static_phase

COLUMNS = ("config", "VGPR", "AGPR", "SGPR", "spills v/s", "scratch", "LDS", "waves", "combine VGPR", "verdict",
           "rank", "reason")


def label(cfg: dict) -> str:
    text = f"BN{cfg['BLOCK_N']} w{cfg['num_warps']} s{cfg['num_stages']}"
    return text + (f" wpe{cfg['waves_per_eu']}" if cfg.get("waves_per_eu") else "")


def row_values(row: dict) -> list:
    k, c = row["kernel"], row["combine"]
    lds = (k.get("lds_bytes") or 0) + (k.get("dynamic_lds_bytes") or 0) if k else None
    return [label(row["config"]), k.get("vgpr_count"), k.get("agpr_count"), k.get("sgpr_count"),
            f"{k.get('vgpr_spill_count', '-')}/{k.get('sgpr_spill_count', '-')}", k.get("scratch_bytes"), lds,
            k.get("waves_per_simd"), c.get("vgpr_count"), "kept" if row["kept"] else "pruned",
            row["static_rank"] if row["static_rank"] is not None else "-", row["reason"] or ""]


def ordered(static: DecodeStatic) -> list:
    return static.ranked + [r for r in static.rows if not r["kept"]]


def markdown(gpu, static: DecodeStatic, command: str) -> str:
    p = static.problem
    lines = [f"# decode kernels on {gpu.name} ({gpu.arch}), cross-compiled", "",
             f"- {datetime.date.today()}; command: `{command}`",
             f"- problem: D={p.head_dim} {p.dtype}, Hq {p.heads_q} / Hkv {p.heads_kv} (GQA {p.group}), "
             f"Sq {p.seqlen_q}, {'paged, page ' + str(p.page_size) if p.page_size else 'contiguous cache'}",
             f"- {len(static.rows)} configs, {len(static.ranked)} kept; registers and occupancy read from the "
             "code objects (`isa_tools`), verdicts from `rocmflash.prune`", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join("" if v is None else str(v) for v in row_values(r)) + " |" for r in ordered(static)]
    return "\n".join(lines) + "\n"


def main(args, command: str) -> int:
    from rich.table import Table

    from rocmflash.gpus import get_gpu
    from rocmflash.report import make_console

    gpu = get_gpu(args.gpu)
    problem = DecodeProblem(head_dim=args.head_dim, dtype=args.dtype, heads_q=args.heads or 32,
                            heads_kv=args.kv_heads or 8, batch=args.batch or 32, seqlen_k=args.seqlen or 4096,
                            page_size=args.page_size or 0).validate()
    static = static_phase(gpu, problem, args.cache_dir, args.workers)
    out_dir = args.out or os.path.join("reports", f"vgpr-decode-{gpu.name}-d{problem.head_dim}-{problem.dtype}")
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ValueError(f"--out {out_dir} is a file; expected a directory")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "report.md"), "w", encoding="utf-8") as f:
        f.write(markdown(gpu, static, command))
    if args.json:
        print(json.dumps([{k: v for k, v in r.items()} for r in ordered(static)], indent=1))
        return 0
    console = make_console()
    table = Table(title=f"decode kernels, {gpu.name} ({gpu.arch}) D={problem.head_dim} {problem.dtype} "
                        f"GQA {problem.group}", header_style="bold")
    for c in COLUMNS:
        table.add_column(c)
    for r in ordered(static)[:60]:
        table.add_row(*["" if v is None else str(v) for v in row_values(r)], style=None if r["kept"] else "dim")
    console.print(table)
    console.print(f"{len(static.ranked)} of {len(static.rows)} decode configs kept; "
                  f"report: {os.path.join(out_dir, 'report.md')}")
    return 0
