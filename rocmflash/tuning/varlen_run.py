"""The varlen tunes end to end: static phase, live phase on a matching GPU, database entry, summary.

Kept apart from :mod:`rocmflash.tuning.varlen` / :mod:`rocmflash.tuning.varlen_bwd` (problem,
keys, space, compile entries, run-time lookups) and :mod:`rocmflash.tuning.varlen_worker` /
:mod:`rocmflash.tuning.varlen_bwd_worker` (what a timing worker runs) so the orchestration reads
on its own. It follows :mod:`rocmflash.tuning.decode_run`: every static survivor is timed (one
packed batch is cheap to time), plus the config ``flash_attn_varlen_func`` served before (for
the forward the dense entry or per-arch default, for the backward the dense ``bwd-`` entry or
per-arch default), so each entry says what tuning the varlen kernels on their own gained.
:func:`tune_varlen` tunes the forward (``--pass fwd``), :func:`tune_varlen_backward` the
backward's dQ and dK/dV kernels (``--pass bwd``).
"""

from __future__ import annotations

from typing import Optional

from rocmflash.static.families import FamilyTuneResult, timed_line
from rocmflash.tuning.varlen import VarlenProblem, config_label


def tune_varlen(gpu_name: str, problem: VarlenProblem, db_path: Optional[str] = None, cache_dir=None,
                workers=None, timeout_s: float = 120.0, on_result=None,
                configs: Optional[list] = None, incumbent: bool = True, pool=None) -> FamilyTuneResult:
    """Static phase for ``gpu_name``'s arch; on a matching live GPU (or ``pool``'s) every survivor (and the baseline) is
    gated and timed, then (``incumbent``) the platform's varlen attention on the same worker; the entry is
    written to the database (atomically, under the tune lock) and the run-time caches of this process are
    cleared. ``configs`` replaces the default space. The problem is a
    :class:`~rocmflash.tuning.items_varlen.VarlenItem` run through the tune pipeline."""
    from rocmflash.tuning.decode_run import tune_one
    from rocmflash.tuning.items_varlen import VarlenItem

    return tune_one(gpu_name, problem,
                    lambda ctx: VarlenItem(ctx, problem, cache_dir, workers, timeout_s, configs, on_result,
                                           incumbent=incumbent),
                    db_path, timeout_s, pool)


def print_varlen_summary(result: FamilyTuneResult, console) -> None:
    e, s, p = result.entry, result.static, result.problem
    console.print(f"varlen tune {result.gpu.name} ({result.gpu.arch}) {result.key}: {len(p.lengths)} sequences "
                  f"of {min(p.lengths)}..{p.max_seqlen} tokens; {len(s.rows)} configs, {len(s.ranked)} survive "
                  "the static phase")
    if result.measured:
        c = e["counts"]
        console.print(timed_line(c))
        if e.get("best"):
            console.print(f"best: {config_label(e['best'])}  {e['time_ms']:.3f} ms, {e['tflops']:.1f} TFLOP/s")
            base = e["baseline"]
            if e.get("speedup_vs_baseline"):
                console.print(f"before: {base['source']} {base['time_ms']:.3f} ms ({e['speedup_vs_baseline']:.2f}x)")
            line = incumbent_line(e.get("incumbent"))
            if line:
                console.print(line)
        if e.get("timing") == "interpreter":
            console.print("(timed in Triton's CPU interpreter: recorded, never served at run time)")
    else:
        console.print(f"not measured ({result.why_unmeasured}); static #1 written with \"measured\": false: "
                      f"{config_label(e['best']) if e.get('best') else None}")
    console.print(f"database: {result.db_path}")


def incumbent_line(field: Optional[dict]) -> Optional[str]:
    """One line on the platform's varlen attention from an entry's ``incumbent`` field (None without one)."""
    if not field:
        return None
    rows = field.get("backends") or {}
    if field.get("backend") and field.get("time_ms") and field.get("triton_ms"):
        ratio = field["time_ms"] / field["triton_ms"]
        side = "faster" if ratio < 1 else "slower"
        return (f"platform's varlen attention ({field['backend']}): {field['time_ms']:.3f} ms, "
                f"{1 / ratio if ratio < 1 else ratio:.2f}x {side} than the winner (stored as the entry's incumbent)")
    why = "; ".join(f"{name}: {r.get('status')}: {r.get('error')}" for name, r in rows.items()) or field.get("error")
    return f"platform's varlen attention: not timed ({why})"


def tune_varlen_backward(gpu_name: str, problem: VarlenProblem, db_path: Optional[str] = None, cache_dir=None,
                         workers=None, timeout_s: float = 120.0, on_result=None,
                         configs: Optional[list] = None) -> FamilyTuneResult:
    """The varlen backward tune (:mod:`rocmflash.tuning.varlen_bwd`): static phase for ``gpu_name``'s arch; on
    a matching live GPU every dQ and dK/dV survivor and the baseline (:func:`backward_baseline`) are gated
    and timed and each kernel's fastest correct config stored; else the static #1 of each, unmeasured. The
    entry goes to the database under the tune lock and this process's run-time caches are cleared.
    ``configs`` (backward space points) replaces the default space. The problem is a
    :class:`~rocmflash.tuning.items_varlen.VarlenBwdItem` run through the tune pipeline."""
    from rocmflash.tuning.decode_run import tune_one
    from rocmflash.tuning.items_varlen import VarlenBwdItem

    return tune_one(gpu_name, problem,
                    lambda ctx: VarlenBwdItem(ctx, problem, cache_dir, workers, timeout_s, configs, on_result),
                    db_path, timeout_s)

def print_varlen_bwd_summary(result: FamilyTuneResult, console) -> None:
    from rocmflash.static.bwd_report import label

    e, s, p = result.entry, result.static, result.problem
    console.print(f"varlen backward tune {result.gpu.name} ({result.gpu.arch}) {result.key}: {len(p.lengths)} "
                  f"sequences of {min(p.lengths)}..{p.max_seqlen} tokens")
    console.print(f"{len(s.rows)} configs (dQ {len(s.of('dq'))}, dK/dV {len(s.of('dkdv'))}), {len(s.ranked('dq'))} "
                  f"dQ and {len(s.ranked('dkdv'))} dK/dV survive the static phase")
    if result.measured:
        c = e["counts"]
        console.print(timed_line(c))
        if e.get("measured"):
            b, t = e["best"], e["time_ms"]
            console.print(f"best: dQ {label(dict(b['dq'], kernel='dq'))} {t['dq']:.3f} ms + dK/dV "
                          f"{label(dict(b['dkdv'], kernel='dkdv'))} {t['dkdv']:.3f} ms = {t['total']:.3f} ms")
            base = e["baseline"]
            if e.get("speedup_vs_baseline"):
                console.print(f"before: {base['source']} {base['time_ms']['total']:.3f} ms "
                              f"({e['speedup_vs_baseline']:.2f}x)")
            if e.get("timing") == "interpreter":
                console.print("(timed in Triton's CPU interpreter: recorded, never served at run time)")
        else:
            console.print(f"not measured: {e.get('why_unmeasured')}")
    else:
        console.print(f"not measured ({result.why_unmeasured}); static #1 of each kernel written with "
                      "\"measured\": false")
    console.print(f"database: {result.db_path}")


__all__ = ["tune_varlen", "print_varlen_summary", "tune_varlen_backward", "print_varlen_bwd_summary"]
