"""``rocmflash vgpr-report --mode decode``: the decode kernels' register use and pruning for a GPU's arch."""

from __future__ import annotations

from rocmflash.static import report_dirs as R
from rocmflash.static.family_report import REGISTER_COLUMNS, publish, register_values
from rocmflash.tuning.decode import DecodeProblem, static_phase

COLUMNS = ("config", *REGISTER_COLUMNS, "combine VGPR", "verdict", "rank", "reason")
#: the report's problem without ``--heads``, ``--kv-heads``, ``--batch``, ``--seqlen`` (``--page-size``: 0, contiguous)
DEFAULTS = {"heads_q": 32, "heads_kv": 8, "batch": 32, "seqlen_k": 4096}


def label(cfg: dict) -> str:
    text = f"BN{cfg['BLOCK_N']} w{cfg['num_warps']} s{cfg['num_stages']}"
    return text + (f" wpe{cfg['waves_per_eu']}" if cfg.get("waves_per_eu") else "")


def row_values(row: dict) -> list:
    return [label(row["config"]), *register_values(row["kernel"]), row["combine"].get("vgpr_count"),
            "kept" if row["kept"] else "pruned", row["static_rank"] if row["static_rank"] is not None else "-",
            row["reason"] or ""]


def problem_of(args, gpu) -> DecodeProblem:
    """The report's problem (validated, the cache's fp8 format the GPU's): the flags, else :data:`DEFAULTS`."""
    return DecodeProblem(head_dim=args.head_dim, dtype=args.dtype, heads_q=args.heads or DEFAULTS["heads_q"],
                         heads_kv=args.kv_heads or DEFAULTS["heads_kv"], batch=args.batch or DEFAULTS["batch"],
                         seqlen_k=args.seqlen or DEFAULTS["seqlen_k"], page_size=args.page_size or 0,
                         kv_dtype=getattr(args, "kv_dtype", None) or "").validate().for_gpu(gpu)


def default_name(gpu, p: DecodeProblem) -> str:
    """The report folder's name (:mod:`rocmflash.static.report_dirs`): ``vgpr-decode-<gpu>-d<D>-<dtype>``, then an
    fp8 cache's format (``-kvfp8e4m3fnuz``: fp8-cache reports do not overwrite the 16-bit one) and each geometry
    flag that is not its default (``-heads16-kvheads4-b8-s8192-page16``)."""
    return R.folder_name("vgpr-decode", gpu, p.head_dim, p.dtype, f"kv{p.kv_dtype}" if p.kv_dtype else "",
                         *R.heads_suffixes(p.heads_q, p.heads_kv, DEFAULTS["heads_q"], DEFAULTS["heads_kv"]),
                         R.number_suffix("b", p.batch, DEFAULTS["batch"]),
                         R.number_suffix("s", p.seqlen_k, DEFAULTS["seqlen_k"]),
                         R.number_suffix("page", p.page_size, 0))


def main(args, command: str) -> int:
    from rocmflash.hw.gpus import get_gpu

    gpu = get_gpu(args.gpu)
    problem = problem_of(args, gpu)
    static = static_phase(gpu, problem, args.cache_dir, args.workers)
    p = problem
    cache = f"{p.kv_dtype} cache" if p.kv_dtype else f"{p.dtype} cache"  # the arch's fp8 format, or 16-bit
    header = [f"problem: D={p.head_dim} {p.dtype}, {cache}, Hq {p.heads_q} / Hkv {p.heads_kv} (GQA {p.group}), "
              f"Sq {p.seqlen_q}, {'paged, page ' + str(p.page_size) if p.page_size else 'contiguous cache'}",
              f"{len(static.rows)} configs, {len(static.ranked)} kept; registers and occupancy read from the "
              "code objects (`isa_tools`), verdicts from `rocmflash.static.prune`"]
    publish(R.out_dir(args, default_name(gpu, p)),
            f"decode kernels on {gpu.name} ({gpu.arch}), {cache}, cross-compiled", header, COLUMNS, static.report_order,
            row_values, command, args.json, f"{len(static.ranked)} of {len(static.rows)} decode configs kept")
    return 0
