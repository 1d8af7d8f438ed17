"""Command line for isa_tools: ``python -m isa_tools PATH...`` (also ``rocmflash isa``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Optional

from isa_tools.errors import CodeObjectError
from isa_tools.summary import kernel_summary
from isa_tools.triton_cache import iter_kernels, triton_asm_for


def add_isa_arguments(parser: argparse.ArgumentParser) -> None:
    """The options shared by ``python -m isa_tools`` and ``rocmflash isa``."""
    parser.add_argument("paths", nargs="*", metavar="PATH",
                        help=".hsaco code objects and/or Triton cache directories")
    parser.add_argument("--json", action="store_true", help="print a JSON array, one object per kernel")
    parser.add_argument("--dynamic-lds", type=_non_negative_int, default=None, metavar="BYTES",
                        help="dynamic LDS per workgroup (default: Triton's 'shared' from the json beside "
                             "the code object, else 0)")
    parser.add_argument("--num-warps", type=_positive_int, default=None, metavar="N",
                        help="waves per workgroup (default: Triton's num_warps, else from the max workgroup size)")


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def summarize_paths(paths: list[str], dynamic_lds: Optional[int] = None,
                    num_warps: Optional[int] = None) -> list[dict]:
    """Summary records for every kernel under ``paths``; flags override Triton's metadata.

    Reads everything before returning, so an unreadable file fails the whole call
    before anything is printed. Where scratch is used (in loops or not) is known only
    for code objects with Triton's ``.amdgcn`` assembly beside them.
    """
    records, asm_by_path = [], {}
    for kernel, meta in iter_kernels(paths):
        lds = dynamic_lds if dynamic_lds is not None else (meta.shared if meta else 0)
        warps = num_warps if num_warps is not None else (meta.num_warps if meta else None)
        if kernel.path not in asm_by_path:
            asm_by_path[kernel.path] = triton_asm_for(kernel.path) if kernel.path else None
        records.append(kernel_summary(kernel, lds, warps, asm_by_path[kernel.path]))
    return records


def print_records(records: list[dict], as_json: bool, title: str = "AMD code objects") -> None:
    """Print records as JSON or as a rich table."""
    if as_json:
        print(json.dumps(records, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, header_style="bold")
    columns = [
        ("kernel", "name"), ("arch", "arch"), ("VGPR", "vgpr_count"), ("AGPR", "agpr_count"),
        ("SGPR", "sgpr_count"), ("alloc V", "allocated_vgprs"), ("alloc S", "allocated_sgprs"),
        ("spill V/S", None), ("scratch", "scratch_bytes"), ("scratch ops loop/out", None), ("LDS st+dyn", None),
        ("warps", "num_warps"),
        ("waves static", "waves_per_simd_static"), ("waves", "waves_per_simd"), ("limiter", "limiter"),
        ("past cliff", "vgprs_past_cliff"), ("headroom", "vgpr_headroom"),
    ]
    for header, _ in columns:
        table.add_column(header, justify="left" if header in ("kernel", "arch", "limiter") else "right")
    for r in records:
        cells = []
        for header, key in columns:
            if header == "spill V/S":
                cells.append(f"{r['vgpr_spill_count']}/{r['sgpr_spill_count']}")
            elif header == "scratch ops loop/out":
                cells.append(_scratch_cell(r))
            elif header == "LDS st+dyn":
                cells.append(f"{r['lds_bytes']}+{r['dynamic_lds_bytes']}")
            else:
                value = r[key]
                cells.append("-" if value is None else str(value))
        table.add_row(*cells)
    console = Console()
    if not console.is_terminal:  # piped output: do not squeeze columns into 80 characters
        console = Console(width=240)
    console.print(table)


def _scratch_cell(record: dict) -> str:
    """``in-loop/outside`` scratch loads+stores, ``?`` without assembly (a bare .hsaco)."""
    if not record.get("scratch_asm_known"):
        return "?"
    loop = record["scratch_loop_loads"] + record["scratch_loop_stores"]
    outside = record["scratch_loads"] + record["scratch_stores"] - loop
    return f"{loop}/{outside}"


def run(args: argparse.Namespace) -> int:
    """Execute a parsed isa command; returns the exit code. Errors are one line on stderr, exit 2."""
    if not args.paths:
        print("error: give at least one .hsaco file or Triton cache directory", file=sys.stderr)
        return 2
    try:
        records = summarize_paths(args.paths, args.dynamic_lds, args.num_warps)
    except CodeObjectError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print_records(records, args.json)
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m isa_tools",
                                     description="Registers, spills, LDS and occupancy of AMD code objects.")
    add_isa_arguments(parser)
    return run(parser.parse_args(argv))
