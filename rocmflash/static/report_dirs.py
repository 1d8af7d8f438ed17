"""Where ``rocmflash vgpr-report`` writes its files: one folder per report, named by what selects the report.

**Names.** A folder's name carries every option that decides what the report holds: the mode and pass
(``vgpr-``, ``vgpr-bwd-``, ``vgpr-decode-``, ``vgpr-varlen-``, ``vgpr-varlen-bwd-``), the GPU, the head dim,
the dtype, then one suffix per option that differs from its default: ``-causal``, the variants of a
``--variant`` subset (``-online``, ``-two_phase-split_d``), the heads, a decode cache's dtype and geometry,
the pruning settings (``-floor1``, ``-margin8``) and ``--reference``. So two different reports never share a
folder: a later ``--variant online`` run cannot replace the full sweep's ``vgpr-mi250-d128-fp16`` (issue 46),
and the default spaces keep the names they always had (``vgpr-mi250-d128-fp16``).

**Location.** ``--out DIR`` names the folder itself. Without it the folder goes under :func:`reports_root`
(``$ROCMFLASH_REPORTS_DIR``, else the user data directory's ``reports``: ``~/.local/share/rocmflash/reports``
on Linux), never under the current directory, so a run from a checkout leaves the checkout as it was; the
path is printed at the end. ``--json`` without ``--out`` writes no file at all: the rows go to stdout only.
"""

from __future__ import annotations

import hashlib
import os
import re
from typing import Optional

#: the environment variable that moves the default reports root (:func:`reports_root`)
REPORTS_ENV = "ROCMFLASH_REPORTS_DIR"


def reports_root() -> str:
    """``$ROCMFLASH_REPORTS_DIR``, else ``<user data dir>/reports`` (``~/.local/share/rocmflash/reports`` on Linux)."""
    env = os.environ.get(REPORTS_ENV)
    if env:
        return env
    import platformdirs

    return os.path.join(platformdirs.user_data_dir("rocmflash"), "reports")


def root_flag() -> str:
    """How an error names the default root: the variable when it is set, else ``--out (default)``."""
    return f"${REPORTS_ENV}" if os.environ.get(REPORTS_ENV) else "--out (default)"


def out_dir(args, name: str) -> Optional[str]:
    """The folder a report writes to: ``--out``; None with ``--json`` and no ``--out`` (nothing is written);
    else ``name`` (:func:`folder_name`; the CLI's :func:`rocmflash.cli.default_folder_name` of the flags) under
    :func:`reports_root`."""
    if args.out:
        return args.out
    if args.json:
        return None
    return os.path.join(reports_root(), name)


def folder_name(prefix: str, gpu, head_dim: int, dtype: str, *suffixes: str) -> str:
    """``<prefix>-<gpu>-d<D>-<dtype>`` and each non-empty suffix, joined by ``-`` (``vgpr-mi250-d128-fp16-online``)."""
    return "-".join([prefix, gpu.name, f"d{head_dim}", dtype, *(s for s in suffixes if s)])


def flag_suffix(on: bool, word: str) -> str:
    """``word`` when the option is on, else ``""`` (``-causal``)."""
    return word if on else ""


def number_suffix(word: str, value, default) -> str:
    """``<word><value>`` when ``value`` is not its default (``heads16``), else ``""``."""
    return "" if value is None or value == default else f"{word}{value}"


def heads_suffixes(heads_q: int, heads_kv: int, default_q: int, default_kv: int) -> tuple:
    """The query and key/value heads' suffixes: each only when it differs from its default."""
    return number_suffix("heads", heads_q, default_q), number_suffix("kvheads", heads_kv, default_kv)


def variants_suffix(variants, every: list) -> str:
    """The named variants in ``every``'s order (``two_phase-split_d``), or ``""`` when they are all of ``every``
    (the default sweep: no ``--variant``, or every variant named). A name ``every`` lacks stays in the name (the
    run refuses it before writing)."""
    if not variants or set(variants) == set(every):
        return ""
    named = [v for v in every if v in variants] + sorted(set(variants) - set(every))
    return "-".join(named)


def reference_suffix(reference: bool, reference_file: Optional[str]) -> str:
    """``reference`` for the packaged AMD-published file; ``reference-<file stem>-<6 hex of its absolute path>``
    for ``--reference-file`` (two files of one name in two folders get two folders); ``""`` without either."""
    if reference_file:
        path = os.path.abspath(reference_file)
        stem = re.sub(r"[^A-Za-z0-9_.]+", "_", os.path.splitext(os.path.basename(path))[0]) or "file"
        return f"reference-{stem}-{hashlib.sha1(path.encode()).hexdigest()[:6]}"
    return "reference" if reference else ""


__all__ = ["REPORTS_ENV", "reports_root", "root_flag", "out_dir", "folder_name", "flag_suffix", "number_suffix",
           "heads_suffixes", "variants_suffix", "reference_suffix"]
