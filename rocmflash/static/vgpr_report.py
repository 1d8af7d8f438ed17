"""``rocmflash vgpr-report``: sweep, prune and explain a GPU's config space with compiler truth."""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import sys
from typing import Optional

from isa_tools import amd_arch, waves_from_vgprs
from rocmflash.static import report_dirs as R
from rocmflash.static.compile import SweepStats, sweep
from rocmflash.config import FP8, KernelConfig, Problem
from rocmflash.hw.gpus import GPU, get_gpu
from rocmflash.static.prune import HARMLESS_SPILL, PruneSettings, prune
from rocmflash.static.report import (ROW_KEYS, config_label, duplicate_count, plot_vgprs, print_table, reason_counts,
                              rows_from_sweep, variant_comparison, write_csv)
from rocmflash.static.space import default_space

#: the seeds' VGPR case study: BLOCK_M=128, BLOCK_N=64, D=128, fp32 accumulator, gfx90a
SEED_TILE = {"BLOCK_M": 128, "BLOCK_N": 64}
SEED_HEAD_DIM = 128


@dataclasses.dataclass
class ReportResult:
    rows: list
    stats: SweepStats
    out_dir: Optional[str]
    seed: list
    reference: object = None  #: a reference_report.ReferenceResult when --reference was given


def run(gpu: GPU, problem: Problem, variants=None, out_dir: Optional[str] = None, cache_dir=None,
        workers=None, settings: PruneSettings = PruneSettings(), console=None, progress=True,
        command: str = "", reference: bool = False, reference_file: Optional[str] = None) -> ReportResult:
    """Sweep the default space for ``gpu``/``problem``, prune it, and write the report files.

    ``reference``: also place the AMD-published configs for the arch (``reference_file``,
    default the packaged one) in the same pipeline (:mod:`rocmflash.static.reference_report`).
    """
    refs = _reference_entries(gpu, problem, reference_file) if reference else None  # a bad file fails first
    configs = default_space(gpu, variants, problem.dtype).configs(problem, gpu)
    observations, stats = _sweep_with_progress(configs, problem, gpu, cache_dir, workers, console, progress)
    rows = rows_from_sweep(configs, observations, prune(observations, settings))
    seed = seed_case_study(cache_dir, workers)
    ref = None
    if reference:
        from rocmflash.static import reference_report

        ref = reference_report.compare(gpu, problem, variants, cache_dir, workers, settings, refs=refs)
    if out_dir:
        extra = [reference_report.markdown(ref)] if ref is not None else []
        write_report(rows, stats, seed, gpu, problem, settings, out_dir, command, extra)
    return ReportResult(rows, stats, out_dir, seed, ref)


def _reference_entries(gpu: GPU, problem: Problem, reference_file: Optional[str]) -> list:
    """The forward reference entries for the GPU's arch that admit the problem's head dim (validated)."""
    from rocmflash.static.reference import load, select

    if gpu.vendor != "amd":
        raise ValueError(f"--reference compares AMD-published configs; {gpu.name} is {gpu.vendor} ({gpu.arch})")
    return select(load(reference_file), arch=gpu.arch, pass_="fwd", problem=problem, strict=False)


def _sweep_with_progress(configs, problem, gpu, cache_dir, workers, console, progress):
    if not progress or console is None:
        return sweep(configs, problem, gpu, cache_dir=cache_dir, workers=workers)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("[bold]compiling for " + gpu.arch), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("sweep", total=len(configs))
        return sweep(configs, problem, gpu, cache_dir=cache_dir, workers=workers,
                     on_result=lambda _: bar.advance(task))


def seed_case_study(cache_dir=None, workers=None) -> list[dict]:
    """The seed's BLOCK_M=128, BLOCK_N=64, D=128 online kernel on gfx90a: estimate beside compiled truth.

    The seed spreads the 128x128 fp32 accumulator over one 64-lane wavefront (256
    VGPRs/lane) and divides a 65,536-register "per-CU" file by ``VGPRs x 64``. On
    gfx90a the accumulator is spread over the whole workgroup (``num_warps`` waves) and
    the register file that decides occupancy is per SIMD: 512 VGPRs per lane, in
    blocks of 8, so waves/SIMD = 512 // alignTo(VGPRs, 8).
    """
    gpu = get_gpu("mi250")
    problem = Problem(head_dim=SEED_HEAD_DIM, dtype="fp16")
    configs = [KernelConfig(variant="online", num_stages=1, num_warps=w, **SEED_TILE) for w in (4, 8)]
    observations, _ = sweep(configs, problem, gpu, cache_dir=cache_dir, workers=workers)
    arch = amd_arch(gpu.arch)
    out = []
    for cfg, obs in zip(configs, observations):
        acc_elems = cfg.BLOCK_M * SEED_HEAD_DIM
        row = {"num_warps": cfg.num_warps, "seed_acc_vgprs_per_lane": acc_elems // 64,
               "seed_total_estimate": "300-330",
               "acc_vgprs_per_lane": acc_elems // (64 * cfg.num_warps)}
        if obs["status"] == "ok":
            k = obs["kernels"][0]
            v = k["allocated_vgprs"]
            row.update(vgpr_count=k["vgpr_count"], agpr_count=k["agpr_count"], allocated_vgprs=v,
                       spills=k["vgpr_spill_count"],
                       seed_waves_per_cu=65536 // (k["vgpr_count"] * 64),
                       waves_per_simd=waves_from_vgprs(arch, v),
                       waves_per_cu=waves_from_vgprs(arch, v) * arch.simds_per_cu,
                       waves_per_simd_full=k["waves_per_simd"], limiter=k["limiter"],
                       acc_share_of_allocation=f"{row['acc_vgprs_per_lane'] / v:.0%}")
        else:
            row["error"] = obs["error"]
        out.append(row)
    return out


def default_name(gpu: GPU, problem: Problem, variants=None, settings: PruneSettings = PruneSettings(),
                 reference: bool = False, reference_file: Optional[str] = None) -> str:
    """The report folder's name: ``vgpr-<gpu>-d<D>-<dtype>`` for the default sweep, then a suffix per option that
    changes what the report holds (:mod:`rocmflash.static.report_dirs`): ``-causal``, a ``--variant`` subset
    (``-online``), a floor or cliff margin other than the default (``-floor1``, ``-margin8``), ``--reference``."""
    every = list(default_space(gpu, None, problem.dtype).knobs)  # the variants of the default sweep (fp8: online)
    base = PruneSettings()
    return R.folder_name("vgpr", gpu, problem.head_dim, problem.dtype, R.flag_suffix(problem.causal, "causal"),
                         R.variants_suffix(variants, every),
                         # any floor given: an explicit one applies to every config (prune.py), the default not
                         R.number_suffix("floor", settings.occupancy_floor, base.occupancy_floor),
                         R.number_suffix("margin", settings.cliff_margin, base.cliff_margin),
                         R.reference_suffix(reference, reference_file))


def problem_of(args) -> Problem:
    """The report's problem: ``--head-dim``, ``--dtype``, ``--causal``."""
    return Problem(head_dim=args.head_dim, dtype=args.dtype, causal=args.causal)


def settings_of(args) -> PruneSettings:
    """The pruner's settings: ``--occupancy-floor``, ``--cliff-margin`` (the CLI fills its default)."""
    return PruneSettings(occupancy_floor=args.occupancy_floor, cliff_margin=args.cliff_margin)


def default_name_of(args, gpu: GPU) -> str:
    """:func:`default_name` of the report the flags ``args`` select."""
    reference_file = getattr(args, "reference_file", None)
    return default_name(gpu, problem_of(args), args.variant, settings_of(args),
                        bool(getattr(args, "reference", False) or reference_file), reference_file)


def default_out_dir(gpu: GPU, problem: Problem, **name_options) -> str:
    """:func:`default_name`'s folder under the reports root (:func:`rocmflash.static.report_dirs.reports_root`)."""
    return os.path.join(R.reports_root(), default_name(gpu, problem, **name_options))


def write_report(rows, stats, seed, gpu, problem, settings, out_dir, command, extra_sections=()) -> None:
    """CSV of every config, a markdown report and a PNG plot under ``out_dir`` (created).

    ``extra_sections``: markdown appended after the variant comparison (e.g. the reference configs).
    """
    os.makedirs(out_dir, exist_ok=True)
    write_csv(rows, os.path.join(out_dir, "configs.csv"))
    title = f"{gpu.name} ({gpu.arch}) D={problem.head_dim} {problem.dtype}" + (" causal" if problem.causal else "")
    plot_vgprs(rows, gpu.arch, os.path.join(out_dir, "vgprs.png"), title)
    text = markdown(rows, stats, seed, gpu, problem, settings, command, extra_sections)
    tmp = os.path.join(out_dir, ".report.md.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, os.path.join(out_dir, "report.md"))


def _md_table(records: list[dict], keys=None) -> str:
    if not records:
        return "_none_\n"
    keys = keys or list(records[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join("-" if r.get(k) is None else str(r.get(k)) for k in keys) + " |" for r in records]
    return "\n".join(lines) + "\n"


def markdown(rows, stats, seed, gpu, problem, settings, command, extra_sections=()) -> str:
    import triton

    counts = reason_counts(rows)
    kept = sorted((r for r in rows if r["verdict"] == "kept"),
                  key=lambda r: (-(r["waves_per_simd"] or 0), r["allocated_vgprs"] or 0))
    pruned = {reason: next(r for r in rows if r["reason"] == reason) for reason in counts
              if not reason.startswith("kept")}
    harmless = [r for r in kept if r["reason"] == HARMLESS_SPILL]
    parts = [
        f"# VGPR report: {gpu.marketing_name} ({gpu.arch})\n",
        f"- date: {datetime.date.today().isoformat()}; Triton {triton.__version__}; compiled on a CPU, "
        "no GPU involved (the counts are the compiler's, occupancy is computed)",
        f"- problem: head_dim={problem.head_dim}, dtype={_dtype_words(problem, gpu)}, causal={problem.causal}, "
        f"GQA ratio {problem.gqa_ratio}",
        f"- command: `{command}`",
        f"- pruning: occupancy floor {settings.floor_for(gpu.arch)} waves/SIMD, cliff margin "
        f"{settings.cliff_margin} VGPRs",
        f"- sweep: {stats.configs} configs, {stats.compiled} compiled, {stats.cache_hits} from cache, "
        f"{stats.failed} failed, {stats.seconds:.1f} s ({stats.configs_per_second:.1f} configs/s)\n",
        "## Verdicts\n",
        _md_table([{"verdict": k, "configs": v} for k, v in sorted(counts.items(), key=lambda kv: -kv[1])]),
        "\nOne example per pruning reason:\n",
        _md_table([{"reason": reason, "config": f"{r['variant']} {config_label(r)}", "why": r["detail"]}
                   for reason, r in pruned.items()]),
        _harmless_markdown(harmless),
        _duplicates_markdown(rows),
        "\n## Kept configs (best occupancy first)\n",
        _md_table([{**{k: r[k] for k in ("variant", "vgpr_count", "agpr_count", "allocated_vgprs", "lds_bytes",
                                          "waves_per_simd", "limiter", "vgpr_headroom")},
                    "config": config_label(r)} for r in kept[:30]],
                  ["config", "variant", "vgpr_count", "agpr_count", "allocated_vgprs", "lds_bytes",
                   "waves_per_simd", "limiter", "vgpr_headroom"]),
        "\n## Accumulator-lifetime variants on the same tile\n",
        "Allocated VGPRs (spills) → waves/SIMD, `waves_per_eu=0`, no PRE_LOAD_V:\n",
        _md_table(variant_comparison(rows)),
        "\n![allocated VGPRs per config](vgprs.png)\n",
        *extra_sections,
        seed_markdown(seed),
        "\nEvery config is in `configs.csv` (keys: " + ", ".join(ROW_KEYS) + ", ...).\n",
    ]
    return "\n".join(parts)


def _dtype_words(problem: Problem, gpu: GPU) -> str:
    """``bf16``, or for fp8 the format it means on this GPU: ``fp8 (float8_e4m3fnuz Q/K/V, bf16 output)``."""
    if problem.dtype != FP8:
        return problem.dtype
    from rocmflash.static.space import fp8_format

    return f"fp8 ({fp8_format(gpu)} Q/K/V, bf16 output)"


def _harmless_markdown(harmless: list[dict]) -> str:
    """One line on the configs kept although they spill (only where it costs little), with an example."""
    if not harmless:
        return ""
    r = harmless[0]
    return (f"\n{len(harmless)} kept config(s) spill, but the assembly shows no scratch access inside a loop "
            f"(reason `{HARMLESS_SPILL}`: a few bytes spilled outside the KV loop, or SGPRs kept in VGPR lanes), "
            f"e.g. {r['variant']} {config_label(r)}: {r['detail']}\n")


def _duplicates_markdown(rows: list[dict]) -> str:
    """One line on the configs that compiled to another config's code object (the ``duplicate_of`` column)."""
    dups = [r for r in rows if r.get("duplicate_of") is not None]
    if not dups:
        return "\nNo two configs compiled to the same code object.\n"
    r = dups[0]
    twin = rows[r["duplicate_of"]]
    return (f"\n{len(dups)} config(s) compiled to the same code object as another (column `duplicate_of` of "
            f"`configs.csv`: the row that represents it; a tune times each code object once), e.g. {r['variant']} "
            f"{config_label(r)} builds the binary of row {r['duplicate_of']} ({twin['variant']} {config_label(twin)}). "
            "Verdicts are "
            "unchanged by it: a twin of a kept config is pruned as `duplicate_binary`, any other keeps its reason.\n")


def seed_markdown(seed: list[dict]) -> str:
    lines = [
        "\n## The seed's VGPR case study, with compiler truth (gfx90a, BLOCK_M=128, BLOCK_N=64, D=128)\n",
        "The seed estimated the 128x128 fp32 accumulator at 128*128/64 = 256 VGPRs per lane (one 64-lane "
        "wavefront holding it all) and ~300-330 VGPRs in total, then divided a 65,536-register file 'per CU' "
        "by VGPRs x 64. Two corrections: the accumulator is spread over every wave of the workgroup "
        "(128*128 / (64 x num_warps) per lane), and the register file that sets occupancy is per SIMD "
        "(512 VGPRs per lane on gfx90a, allocated in blocks of 8; 4 SIMDs per CU). "
        "`acc_share_of_allocation` tests the seed's claim that the accumulator dominates: it is the "
        "accumulator's registers over what the compiler allocated; the rest is the Q tile, the score and "
        "probability tiles, K/V fragments and addressing, which the variant table above shrinks in other ways.\n",
        _md_table(seed, [k for k in ("num_warps", "seed_acc_vgprs_per_lane", "seed_total_estimate",
                                     "acc_vgprs_per_lane", "vgpr_count", "agpr_count", "allocated_vgprs",
                                     "acc_share_of_allocation", "spills", "seed_waves_per_cu", "waves_per_simd",
                                     "waves_per_cu", "waves_per_simd_full", "limiter", "error") if any(k in r for r in seed)]),
    ]
    return "\n".join(lines)


def print_summary(result: ReportResult, console, gpu: GPU) -> None:
    counts = reason_counts(result.rows)
    st = result.stats
    console.print(f"[bold]{gpu.name} ({gpu.arch})[/bold]: {st.configs} configs — {st.compiled} compiled, "
                  f"{st.cache_hits} from cache ({'warm' if st.compiled == 0 else 'cold'} run), {st.failed} failed, "
                  f"{st.seconds:.1f} s, {st.configs_per_second:.1f} configs/s")
    console.print("verdicts: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])))
    dups = duplicate_count(result.rows)
    if dups:
        console.print(f"{dups} config(s) compiled to another config's code object (column duplicate_of)")
    for row in result.seed:
        if "allocated_vgprs" in row:
            console.print(
                f"seed case (gfx90a 128x64 D128, {row['num_warps']} warps): seed estimated ~300-330 VGPRs and "
                f"{row.get('seed_waves_per_cu')} waves/CU; compiler allocated {row['allocated_vgprs']} "
                f"({row['vgpr_count']} counted, {row['agpr_count']} AGPRs) → {row['waves_per_simd']} waves/SIMD "
                f"= {row['waves_per_cu']} waves/CU")
    if result.out_dir:
        console.print(f"wrote {os.path.join(result.out_dir, 'report.md')}, configs.csv, vgprs.png")


def json_rows(rows: list[dict]) -> str:
    return json.dumps([{**{k: r[k] for k in ROW_KEYS}, **{k: r[k] for k in r if k not in ROW_KEYS}}
                       for r in rows], indent=1)


def main(args, command: str) -> int:
    """Entry from the CLI; returns the exit code."""
    from rocmflash.static.report import make_console

    gpu = get_gpu(args.gpu)
    problem, settings = problem_of(args), settings_of(args)
    console = make_console(stderr=args.json)
    reference = bool(getattr(args, "reference", False) or getattr(args, "reference_file", None))
    out_dir = R.out_dir(args, default_name_of(args, gpu))  # None with --json and no --out: nothing written
    result = run(gpu, problem, args.variant, out_dir, args.cache_dir, args.workers, settings, console,
                 progress=sys.stderr.isatty() or not args.json, command=command, reference=reference,
                 reference_file=getattr(args, "reference_file", None))
    if args.json:
        if result.reference is None:
            print(json_rows(result.rows))
        else:
            from rocmflash.static.reference_report import to_records

            print(json.dumps({"configs": json.loads(json_rows(result.rows)),
                              "reference": to_records(result.reference)}, indent=1))
        return 0
    print_table(result.rows, console, f"{gpu.name} ({gpu.arch}) D={problem.head_dim} {problem.dtype}", limit=60)
    print_summary(result, console, gpu)
    if result.reference is not None:
        from rocmflash.static.reference_report import print_table as print_reference

        print_reference(result.reference, console)
    return 0
