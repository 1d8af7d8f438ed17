"""Database entries of a tune: measured (from the journal's records) or static (the ranking only)."""

from __future__ import annotations

from typing import Optional

from rocmflash.config import FP8, KernelConfig
from rocmflash.db import key_dtype, now_iso, problem_key, seqlen_bucket
from rocmflash.hw.gpus import GPU
from rocmflash.hw.roofline import Shape, roofline
from rocmflash.tuning.spec import NEAR_BEST_PCT, STATIC_SCORE_DOC
from rocmflash.tuning.static import StaticResult

def _record_label(r: dict) -> str:
    return KernelConfig.from_dict(r["config"]).to_json()


def measured_entry(gpu: GPU, shape: Shape, records: list, static: StaticResult, strategy: str,
                   timed_total: int, complete: bool, env: dict, rounds: Optional[list] = None) -> dict:
    """The database entry of a measured problem. ``records``: the timings the winner is read from
    (a race's last round); ``rounds``: a race's ``{config json: record}`` per round (counts)."""
    ok = sorted((r for r in records if r["status"] == "ok"), key=lambda r: r["median_ms"])
    latest = list(records)
    if rounds is not None:  # each config's furthest round says how it ended
        furthest: dict = {}
        for by_config in rounds:
            furthest.update(by_config)
        latest = list(furthest.values())
    counts = {"space": len(static.candidates), "survivors": sum(c.kept for c in static.candidates),
              "to_time": timed_total, "timed": len(latest)}
    if rounds is not None:
        counts["rounds"] = [len(by_config) for by_config in rounds]
    seeds = [{"id": r["seed"], "config": r["config"], "status": r["status"], "tflops": r.get("tflops"),
              "round": r.get("round"), "reason": r.get("reason")} for r in latest if r.get("seed")]
    for status in ("ok", "incorrect", "failed", "timeout", "crashed"):
        counts[status] = sum(1 for r in latest if r["status"] == status)
    roof = roofline(gpu, shape)
    entry = {"problem": _problem_dict(shape, gpu), "shape": shape.to_dict(), "measured": True, "strategy": strategy,
             "complete": complete, "best": None, "tflops": None, "time_ms": None, "near_best": [],
             "near_best_pct": NEAR_BEST_PCT, "best_per_variant": {}, "roofline": roof.to_dict(), "efficiency": None,
             "counts": counts, "when": now_iso(), "fingerprint": env}
    if seeds:
        entry["seeds"] = seeds
    if shape.dtype == FP8:
        entry["incumbent_note"] = NO_FP8_INCUMBENT
    if any(r.get("interpreted") for r in records):
        entry["timing"] = "interpreter"
        entry["note"] = ("timed in Triton's CPU interpreter (TRITON_INTERPRET=1) at a tiny shape: the ranking says "
                         "nothing about GPU speed, and run-time selection ignores this entry")
    if ok:
        best = ok[0]
        entry.update(best=best["config"], tflops=round(best["tflops"], 2), time_ms=round(best["median_ms"], 5),
                     efficiency=round(roof.efficiency(best["median_ms"]), 4),
                     best_static_rank=best.get("static_rank"), best_verdict=best.get("reason") or "kept")
        if best.get("passes_ms"):  # a race's last round: the winner's time in each pass (time_ms is their median)
            entry["passes_ms"] = best["passes_ms"]
        limit = best["median_ms"] * (1 + NEAR_BEST_PCT / 100)
        entry["near_best"] = [{"config": r["config"], "tflops": round(r["tflops"], 2),
                               "time_ms": round(r["median_ms"], 5)} for r in ok[1:] if r["median_ms"] <= limit]
        for r in ok:
            entry["best_per_variant"].setdefault(r["config"]["variant"], {"config": r["config"],
                                                                          "tflops": round(r["tflops"], 2)})
    else:
        entry["note"] = "no timed config passed: every one failed, crashed, timed out or was incorrect"
    return entry


def static_entry(gpu: GPU, shape: Shape, static: StaticResult, why: str, env: dict) -> dict:
    ranked = static.ranked
    per_variant = {}
    for c in ranked:
        per_variant.setdefault(c.config.variant, {"config": c.config.to_dict(), "tflops": None})
    return {"problem": _problem_dict(shape, gpu), "shape": shape.to_dict(), "measured": False, "strategy": "static",
            "complete": True, "best": ranked[0].config.to_dict() if ranked else None, "tflops": None,
            "time_ms": None, "near_best": [], "near_best_pct": NEAR_BEST_PCT, "best_per_variant": per_variant,
            "ranked": [c.summary() for c in ranked[:8]], "roofline": roofline(gpu, shape).to_dict(),
            "efficiency": None,
            "counts": {"space": len(static.candidates), "survivors": len(ranked), "to_time": 0, "timed": 0},
            "seeds": [{"id": c.seed, "config": c.config.to_dict(), "kept": c.kept, "reason": c.reason,
                       "static_rank": c.static_rank} for c in static.candidates if c.seed],
            "note": f"UNMEASURED: static ranking only, nothing was benchmarked ({why}). {STATIC_SCORE_DOC}.",
            "when": now_iso(), "fingerprint": env}


#: why an fp8 entry has no ``incumbent`` (the platform's SDPA timed beside the winner, :mod:`rocmflash.api.incumbent`)
NO_FP8_INCUMBENT = ("no incumbent: torch's SDPA has no fp8 attention (its backends take fp16/bf16/fp32 q, k, v), so "
                    "nothing of the platform's computes this problem to time beside the fp8 kernel")


def entry_dtype(shape: Shape, gpu: Optional[GPU] = None) -> str:
    """The dtype a database key gives ``shape``: ``fp16``/``bf16``, or for an fp8 shape the format ``gpu``
    computes in (``fp8e4m3fnuz`` on gfx942, ``fp8e4m3fn`` on gfx950/sm_89+: :func:`rocmflash.db.key_dtype`);
    ``ValueError`` for an fp8 shape without a GPU (its key would not say the format)."""
    if shape.dtype != FP8:
        return key_dtype(shape.dtype)
    if gpu is None:
        raise ValueError("an fp8 shape's database key needs the GPU: the key names its fp8 format")
    from rocmflash.static.space import fp8_format

    return key_dtype(fp8_format(gpu))


def _problem_dict(shape: Shape, gpu: Optional[GPU] = None) -> dict:
    out = {"head_dim": shape.head_dim, "dtype": entry_dtype(shape, gpu), "causal": shape.causal,
           "gqa_ratio": shape.heads_q // shape.heads_kv, "seqlen_bucket": seqlen_bucket(shape.seqlen_k)}
    if shape.dtype == FP8:  # the inputs' torch dtype (q, k and v; the output is bf16)
        from rocmflash.static.space import fp8_format

        out["fp8_format"] = fp8_format(gpu)
    return out


def shape_key(shape: Shape, gpu: Optional[GPU] = None) -> str:
    """The database key of a forward shape (``gpu``: required for an fp8 shape, whose key names the format)."""
    return problem_key(shape.head_dim, entry_dtype(shape, gpu), shape.causal, shape.heads_q // shape.heads_kv,
                       seqlen_bucket(shape.seqlen_k))
