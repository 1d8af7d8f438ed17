"""The report shared by ``vgpr-report --mode decode`` and ``--pass bwd``: one row per compiled config.

Each caller gives its column names, a row -> values function and the header lines; this
module writes ``report.md`` under the output directory (none: ``--json`` without ``--out``,
:func:`rocmflash.static.report_dirs.out_dir`) and prints the table (or JSON).
"""

from __future__ import annotations

import datetime
import json
import os
from typing import Optional


def output_dir(path: str) -> str:
    """``path`` made ready for the report (ValueError, one line, when it is a file)."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"--out {path} is a file; expected a directory")
    os.makedirs(path, exist_ok=True)
    return path


def markdown(title: str, header: list, columns: tuple, rows: list, row_values, command: str) -> str:
    lines = [f"# {title}", "", f"- {datetime.date.today()}; command: `{command}`", *[f"- {h}" for h in header], "",
             "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join("" if v is None else str(v) for v in row_values(r)) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def publish(out_dir: Optional[str], title: str, header: list, columns: tuple, rows: list, row_values, command: str,
            as_json: bool, footer: str, max_rows: int = 60) -> None:
    """Write ``report.md`` under ``out_dir`` (None: no file) and print the rows as a rich table (dimmed when
    pruned) or as JSON."""
    from rich.table import Table

    from rocmflash.static.report import make_console

    if out_dir is not None:
        with open(os.path.join(output_dir(out_dir), "report.md"), "w", encoding="utf-8") as f:
            f.write(markdown(title, header, columns, rows, row_values, command))
    if as_json:
        print(json.dumps(rows, indent=1, default=str))
        return
    console = make_console()
    table = Table(title=title, header_style="bold")
    for c in columns:
        table.add_column(c)
    for r in rows[:max_rows]:
        table.add_row(*["" if v is None else str(v) for v in row_values(r)], style=None if r["kept"] else "dim")
    console.print(table)
    console.print(footer + (f"; report: {os.path.join(out_dir, 'report.md')}" if out_dir is not None else ""))


def register_values(kernel: dict) -> list:
    """VGPR, AGPR, SGPR, spills (v/s), scratch, LDS and waves of one kernel summary."""
    lds = (kernel.get("lds_bytes") or 0) + (kernel.get("dynamic_lds_bytes") or 0) if kernel else None
    return [kernel.get("vgpr_count"), kernel.get("agpr_count"), kernel.get("sgpr_count"),
            f"{kernel.get('vgpr_spill_count', '-')}/{kernel.get('sgpr_spill_count', '-')}", kernel.get("scratch_bytes"),
            lds, kernel.get("waves_per_simd")]


REGISTER_COLUMNS = ("VGPR", "AGPR", "SGPR", "spills v/s", "scratch", "LDS", "waves")
