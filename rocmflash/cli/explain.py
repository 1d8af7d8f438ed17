"""``rocmflash explain``: which config run-time selection picks for a problem, and why.

No GPU needed: the GPU is named, and its databases (yours, then the shipped one) are
read exactly as :func:`rocmflash.api.selection.select_config` reads them on that GPU. The
answer shows

* every database entry of the same head dim, dtype, causal flag and GQA ratio, its
  sequence-length bucket and distance from the asked one, whether it is measured (only
  measured entries are served), and which one wins;
* entries of *other* head dims or GQA ratios that exist but are not used (another head
  dim or group size builds another kernel: their winners do not carry over);
* what the chosen config compiles to on the GPU's arch for the asked problem
  (cross-compiled on this CPU, cached) and the pruner's verdict: a config that spills or
  fails to compile there is flagged, and the first candidate that does not is named;
* the decision of run time's first-use build check (:mod:`rocmflash.api.build_check`) for the chosen entry:
  its configs cross-compiled here and compared with the entry's record as run time compares its compiled
  kernel ("served X instead of Y because ...").
"""

from __future__ import annotations

import os
from typing import Optional

from rocmflash.api.selection import NO_DB_ENV, db_disabled
from rocmflash.config import KernelConfig, Problem, default_config, normalize_dtype
from rocmflash.hw.gpus import GPU, get_gpu


def _entry_row(path: str, bucket: int, entry: dict, target_bits: int, variant: str) -> dict:
    from rocmflash.db import _pick, servable

    cfg = _pick(entry, variant)
    served = servable(entry)
    why_not = None
    if not entry.get("measured"):
        why_not = "unmeasured (static ranking): never served at run time"
    elif entry.get("timing") == "interpreter":
        why_not = "timed in the CPU interpreter: never served"
    elif cfg is None:
        why_not = f"no {variant} config in this entry"
    return {"path": path, "bucket": bucket, "distance": abs(bucket.bit_length() - target_bits),
            "measured": bool(entry.get("measured")), "served": served and cfg is not None, "why_not": why_not,
            "config": cfg, "tflops": entry.get("tflops"), "strategy": entry.get("strategy"), "when": entry.get("when")}


def explain(gpu_name: str, head_dim: int, dtype: str, causal: bool, seqlen: int, seqlen_k: Optional[int] = None,
            gqa_ratio: int = 1, variant: str = "online", db_path: Optional[str] = None, check: bool = True,
            cache_dir: Optional[str] = None, batch: int = 1, heads: Optional[int] = None) -> dict:
    """The selection for one problem on ``gpu_name`` and the evidence for it (a JSON-able dict). ``batch`` (and
    ``heads``, query heads, default ``8 * gqa_ratio``): how much work the call is -- a decode-shaped problem's
    ``decode-`` entry is per batch bucket, and a short dense call may be host-bound (:mod:`rocmflash.api.host_bound`)."""
    from rocmflash import db

    gpu = get_gpu(gpu_name)
    dtype = normalize_dtype(dtype)
    if type(seqlen) is not int or seqlen < 1:
        raise ValueError(f"--seqlen {seqlen!r} is invalid; expected a positive int")
    seqlen_k = seqlen if seqlen_k is None else seqlen_k
    if heads is not None and (type(heads) is not int or heads < 1 or heads % max(int(gqa_ratio), 1)):
        raise ValueError(f"--heads {heads!r} is invalid; expected a positive multiple of --gqa {gqa_ratio}")
    if type(seqlen_k) is not int or seqlen_k < 1:
        raise ValueError(f"--seqlen-k {seqlen_k!r} is invalid; expected a positive int")
    if type(gqa_ratio) is not int or gqa_ratio < 1:
        raise ValueError(f"--gqa {gqa_ratio!r} is invalid; expected a positive int")
    if type(batch) is not int or batch < 1:
        raise ValueError(f"batch {batch!r} is invalid; expected a positive int")
    Problem(head_dim=head_dim, dtype=dtype)  # validates the head dim
    bucket = db.seqlen_bucket(seqlen_k)
    asked = db.problem_key(head_dim, dtype, causal, gqa_ratio, bucket)
    target_bits = bucket.bit_length()
    rows = [_entry_row(p, b, e, target_bits, variant)
            for p, b, e in db.entries_for(gpu.name, head_dim, dtype, causal, gqa_ratio, db_path)]
    rows.sort(key=lambda r: (r["distance"], -r["bucket"]))
    match = None if db_disabled() else \
        db.lookup_match(gpu.name, head_dim, dtype, causal, gqa_ratio, seqlen_k, variant=variant, measured_only=True,
                        db_path=db_path)
    if match is not None:
        choice = {"source": "db", "entry": match.key, "bucket_distance": match.bucket_distance, "path": match.path,
                  "config": match.config.to_dict()}
        for r in rows:
            r["chosen"] = r["path"] == match.path and r["bucket"] == match.bucket
    else:
        cfg = default_config(gpu.arch, head_dim, variant)
        choice = {"source": "default", "entry": None, "bucket_distance": None, "path": None, "config": cfg.to_dict(),
                  "why": f"{NO_DB_ENV} is set" if db_disabled() else
                  f"no measured {gpu.name} entry for {asked.rsplit('-s', 1)[0]}"}
    others = [{"head_dim": g[0], "dtype": g[1], "causal": g[2], "gqa_ratio": g[3], "buckets": sorted(set(bs))}
              for g, bs in db.groups_for(gpu.name, db_path).items()
              if g != (head_dim, dtype, bool(causal), gqa_ratio)]
    others.sort(key=lambda o: (o["dtype"] != dtype, o["causal"] != bool(causal), abs(o["head_dim"] - head_dim),
                               abs(o["gqa_ratio"] - gqa_ratio)))
    result = {"gpu": gpu.name, "arch": gpu.arch, "asked": asked, "seqlen_q": seqlen, "seqlen_k": seqlen_k,
              "variant": variant, "databases": [db_path] if db_path else db.database_paths(gpu.name),
              "candidates": rows, "choice": choice, "other_groups": others[:6],
              "runs": _what_runs(gpu.name, head_dim, dtype, bool(causal), seqlen, seqlen_k, gqa_ratio, variant,
                                 match, batch, db_path, heads)}
    if db_path is None and not db_disabled():
        from rocmflash.api.varlen_incumbent import decide

        result["varlen"] = decide(gpu.name, head_dim, dtype, bool(causal), gqa_ratio, seqlen_k)
        result["varlen_train"] = decide(gpu.name, head_dim, dtype, bool(causal), gqa_ratio, seqlen_k, train=True)
    if check:
        problem = Problem(head_dim=head_dim, dtype=dtype, causal=bool(causal), heads_q=8 * gqa_ratio, heads_kv=8,
                          seqlen_q=seqlen, seqlen_k=seqlen_k)
        result["verdict"] = _verdict(gpu, problem, KernelConfig.from_dict(choice["config"]), cache_dir)
        if not result["verdict"]["kept"]:
            result["fallback"] = _first_clean(gpu, problem, rows, result["choice"], cache_dir, variant)
        if match is not None:
            result["build_check"] = _build_check(gpu, problem, match, variant)
    return result


def _build_check(gpu: GPU, problem: Problem, match, variant: str) -> dict:
    """What run time's first-use build check (:mod:`rocmflash.api.build_check`) decides for the entry ``match``
    names, with each candidate cross-compiled here for the GPU's arch (in this process) and read and compared as
    run time reads and compares its compiled kernel: ``{"checked", "served", "label", "replaced", "text"}``."""
    from rocmflash.api import build_check
    from rocmflash.api.selection import match_entry

    if build_check.disabled():
        return {"checked": False, "served": match.config.to_dict(), "label": "best", "replaced": False,
                "text": f"{build_check.NO_BUILD_CHECK_ENV} is set: the entry's config serves unchecked"}
    entry = match_entry(gpu.name, problem.head_dim, problem.dtype, problem.causal,
                        problem.heads_q // problem.heads_kv, match)
    backend = gpu.triton_target().backend
    check = build_check.Check(match.key, match.path, backend,
                              build_check.candidates(entry, match.config, gpu.arch, problem.head_dim, variant),
                              entry.get("compiler") if isinstance(entry.get("compiler"), dict) else None, warn=False)
    build_check.decide(check, lambda cfg: _cross_profile(gpu, problem, cfg, backend))
    return {"checked": True, "served": check.config().to_dict(), "label": check.candidates[check.index].label,
            "replaced": check.replaced, "text": check.summary()}


def _cross_profile(gpu: GPU, problem: Problem, cfg: KernelConfig, backend: str) -> dict:
    """The profile of ``cfg`` cross-compiled for the GPU's arch at ``problem``, read by the run-time check's own
    reader (:func:`rocmflash.api.build_check.kernel_profile`); a build that fails: its failed profile."""
    from rocmflash.api import build_check
    from rocmflash.kernels.launch import CompiledLaunch
    from rocmflash.static.compile import compile_forward

    try:
        kernels = compile_forward(gpu.triton_target(), cfg, problem, gpu)
    except Exception as err:  # noqa: BLE001 - a config that does not build is the evidence itself
        return build_check.failed_profile(err)
    return build_check.kernel_profile(CompiledLaunch(kernels[0].name, cfg, kernels[0]), backend)


def _what_runs(gpu_name: str, head_dim: int, dtype: str, causal: bool, seqlen_q: int, seqlen_k: int,
               gqa_ratio: int, variant: str, match, batch: int = 1, db_path: Optional[str] = None,
               heads: Optional[int] = None) -> dict:
    """What a call without ``config=`` runs, forward alone and with gradients: rocmflash's kernel or the
    platform's SDPA backend the entry measured faster (:mod:`rocmflash.api.incumbent`), with both times and why
    -- decided by the functions run-time dispatch uses. A decode-shaped call: its ``decode-`` entry's eager
    timing (:func:`_what_decode_runs`)."""
    from rocmflash.api.host_bound import expected_ms, side_winner, work_scale
    from rocmflash.api.incumbent import is_decode, serving_refusal, shape_excludes
    from rocmflash.api.selection import incumbent_timing

    if variant == "online" and is_decode(seqlen_q, seqlen_k, gqa_ratio):
        return _what_decode_runs(gpu_name, head_dim, dtype, causal, seqlen_q, seqlen_k, gqa_ratio, batch, db_path)
    field, why = incumbent_timing(gpu_name, head_dim, dtype, causal, gqa_ratio, match)
    if variant != "online":
        why = f"variant {variant} asked for: rocmflash's kernel"
    else:
        why = shape_excludes(causal, seqlen_q, seqlen_k, gqa_ratio) or why
    out = {"incumbent": field, "timed_on": _timed_on(field, match.path if match is not None else None)}
    heads = heads or 8 * gqa_ratio
    shape, floors = _host_model(gpu_name, head_dim, dtype, causal, gqa_ratio, match, field, db_path)
    for side, train in (("forward", False), ("forward+backward", True)):
        times = (field.get("train") if train else field) if field else None
        backend = None if why else side_winner(field, shape, floors, train, batch, heads, seqlen_q, seqlen_k, causal,
                                               check=False)
        refused = serving_refusal(backend, field)  # what the times chose, where it may not serve here
        backend = None if refused else backend
        out[side] = {"runs": f"SDPA ({backend})" if backend else "rocmflash",
                     "sdpa_ms": times.get("time_ms") if times else None,
                     "sdpa_backend": times.get("backend") if times else None,
                     "rocmflash_ms": times.get("triton_ms") if times else None,
                     "why": why or refused or ("SDPA was faster" if backend else "rocmflash was as fast or faster")}
        if not _side_timed(why, refused, times) and variant == "online" \
                and shape_excludes(causal, seqlen_q, seqlen_k, gqa_ratio) is None:
            out[side].update(_first_use(gpu_name, head_dim, dtype, causal, gqa_ratio, batch, heads, seqlen_q, seqlen_k,
                                        train))
        floor = (floors.get("train") if train else floors) if floors else None
        out[side]["asked"] = _asked_times(times, floor, _entry_shape(gpu_name, head_dim, dtype, causal, gqa_ratio,
                                                                     match), batch, heads, seqlen_q, seqlen_k, causal)
        if not why and not refused and shape is not None and times and floor and times.get("time_ms") is not None \
                and floor.get("time_ms") is not None:
            scale = work_scale(shape, batch, heads, seqlen_q, seqlen_k, causal)
            sdpa_ms, triton_ms = expected_ms(times, floor, scale)
            out[side].update(expected_sdpa_ms=round(sdpa_ms, 5), expected_rocmflash_ms=round(triton_ms, 5),
                             why=f"expected eager time per call at B{batch} H{heads} (each side's host floor or "
                                 f"its kernel time scaled to this call, x{scale:.3g} of the entry's work): "
                                 + ("SDPA faster" if backend else "rocmflash as fast or faster"))
    return out


def _side_timed(why, refused, times) -> bool:
    """Whether an entry's timing decides this side (else the first-use decision does)."""
    from rocmflash.api.host_bound import has_times

    return not why and not refused and has_times(times)


def _first_use(gpu_name, head_dim, dtype, causal, gqa_ratio, batch, heads, seqlen_q, seqlen_k, train) -> dict:
    """What the first-use decision (:mod:`rocmflash.api.first_use`) says of a side no entry's timing decides: the
    record of this problem's bucket in the user's decisions file, or that the first eager call will time it."""
    from rocmflash.api import first_use
    from rocmflash.api.selection import incumbent_disabled

    key = first_use.decision_key(head_dim, dtype, causal, gqa_ratio, batch, heads, seqlen_q, seqlen_k, train)
    if not first_use.enabled() or incumbent_disabled():
        return {"first_use": {"key": key, "record": None, "note": "first-use timing is off"}}
    rec = first_use.stored(gpu_name, key)
    if rec is None:
        return {"first_use": {"key": key, "record": None, "path": first_use.decisions_path(gpu_name),
                              "note": "not timed yet: the first eager call on a live GPU times rocmflash against SDPA"}}
    env = rec.get("environment") or {}
    served = "SDPA (default)" if rec.get("served_by") == "sdpa" else "rocmflash"
    return {"runs": served, "sdpa_ms": rec.get("sdpa_ms"), "sdpa_backend": "default",
            "rocmflash_ms": rec.get("rocmflash_ms"),
            "why": f"first-use timing {key} on {env.get('device')} at {rec.get('when')} (torch {env.get('torch')}, "
                   f"Triton {env.get('triton')}, rocmflash {env.get('rocmflash')}; another environment times it again)",
            "first_use": {"key": key, "record": rec, "path": first_use.decisions_path(gpu_name)}}


def _entry_shape(gpu_name, head_dim, dtype, causal, gqa_ratio, match) -> Optional[dict]:
    """The shape (batch, heads, lengths) the entry ``match`` names was timed at, or None."""
    from rocmflash.api.selection import match_entry

    shape = match_entry(gpu_name, head_dim, dtype, causal, gqa_ratio, match).get("shape")
    return shape if isinstance(shape, dict) else None


def _asked_times(times: Optional[dict], floor: Optional[dict], shape: Optional[dict], batch: int, heads: int,
                 seqlen_q: int, seqlen_k: int, causal: bool) -> Optional[dict]:
    """Each side's time for the asked call, not the entry's: ``{"sdpa_ms", "rocmflash_ms", "shape", "scale",
    "basis"}``, or None where the entry holds no times to start from. A kernel-timed entry is scaled by the call's
    work over the entry shape's, and held at each side's host floor where one was measured
    (:mod:`rocmflash.api.host_bound`, as dispatch expects it); an eager-timed entry's times are per call at its
    own shape, so they are the asked call's only where the shapes agree (else scale and basis say so)."""
    from rocmflash.api.host_bound import expected_ms, work_scale
    from rocmflash.api.incumbent import EAGER_TIMING

    if not times or times.get("time_ms") is None or times.get("triton_ms") is None or shape is None:
        return None
    asked = {"batch": batch, "heads_q": heads, "seqlen_q": seqlen_q, "seqlen_k": seqlen_k}
    scale = work_scale(shape, batch, heads, seqlen_q, seqlen_k, causal)
    if times.get("timing") == EAGER_TIMING:
        same = all(shape.get(k) == v for k, v in asked.items())
        return {"sdpa_ms": times["time_ms"] if same else None, "rocmflash_ms": times["triton_ms"] if same else None,
                "shape": asked, "scale": round(scale, 6),
                "basis": "eager per-call times of this very shape" if same else
                "eager per-call times of the entry's shape only (host time does not scale): not estimated"}
    if floor and floor.get("time_ms") is not None and floor.get("triton_ms") is not None:
        sdpa, triton_ms = expected_ms(times, floor, scale)
        basis = f"kernel times x{scale:.3g} of the entry's work, at least each side's host floor"
    else:
        sdpa, triton_ms = times["time_ms"] * scale, times["triton_ms"] * scale
        basis = f"kernel times x{scale:.3g} of the entry's work (no host floor measured: kernel time only)"
    return {"sdpa_ms": round(sdpa, 5), "rocmflash_ms": round(triton_ms, 5), "shape": asked, "scale": round(scale, 6),
            "basis": basis}


def _timed_on(field: Optional[dict], path: Optional[str]) -> Optional[dict]:
    """What an incumbent ``field`` was timed on against this torch: ``{"record"`` (the field's ``timed_on``, None
    for a field written before it existed), ``"database_platform"`` (its database's fingerprint, which judges
    such a field), ``"this_torch"`` (:func:`rocmflash.hw.platform.sdpa_record`), ``"note"}``; None without a field.
    Another torch version of the same platform keeps the times (the note says so)."""
    if not field:
        return None
    from rocmflash.api.incumbent import database_platform
    from rocmflash.hw.platform import PLATFORM_NAMES, record_platform, sdpa_record

    record, here, db_platform = field.get("timed_on"), sdpa_record(), database_platform(path)
    if not isinstance(record, dict):
        judged = PLATFORM_NAMES.get(db_platform, "no GPU runtime named: only backends this platform offers serve")
        note = f"timed before incumbents recorded their platform; judged by the database's fingerprint ({judged})"
    else:
        note = f"timed on {_describe_record(record)}; this is {_describe_record(here)}"
        if record_platform(record) == here["platform"] and record.get("torch") != here["torch"]:
            note += ": another torch version of the same platform, its times are kept (re-tune to refresh them)"
    return {"record": record if isinstance(record, dict) else None, "database_platform": db_platform,
            "this_torch": here, "note": note}


def _describe_record(record: dict) -> str:
    """``torch 2.11.0+cu130 (CUDA 13.0, cuDNN 91002)`` of an :func:`rocmflash.hw.platform.sdpa_record`."""
    from rocmflash.hw.platform import PLATFORM_NAMES, record_platform

    parts = [PLATFORM_NAMES.get(record_platform(record), "an unknown platform").split(" (")[0]
             + (f" {record.get('hip') or record.get('cuda')}" if record.get("hip") or record.get("cuda") else "")]
    if record.get("cudnn"):
        parts.append(f"cuDNN {record['cudnn']}")
    if record.get("rocm_fa_library"):
        parts.append(f"flash library {record['rocm_fa_library']}")
    return f"torch {record.get('torch')} ({', '.join(parts)})"


def _host_model(gpu_name, head_dim, dtype, causal, gqa_ratio, match, field, db_path) -> tuple:
    """``(the entry's shape, the host floors)`` when a kernel-timed entry is scaled to the call
    (:mod:`rocmflash.api.host_bound`), else ``(None, None)``."""
    from rocmflash.api.host_bound import shape_and_floors
    from rocmflash.api.incumbent import EAGER_TIMING

    if match is None or not field or field.get("timing") == EAGER_TIMING:
        return None, None
    return shape_and_floors(gpu_name, head_dim, dtype, causal, gqa_ratio, match, db_path)


DECODE_KERNEL = "rocmflash (split-KV decode kernel)"
#: flash_attn_with_kvcache's route, said beside every decode-shaped explanation
KVCACHE_NOTE = ("flash_attn_with_kvcache always runs the decode kernel: SDPA cannot take cache_seqlens, "
                "cache_leftpad, a block table or the in-place append without extra copies")


def _what_decode_runs(gpu_name, head_dim, dtype, causal, seqlen_q, seqlen_k, gqa_ratio, batch, db_path) -> dict:
    """A decode-shaped call through ``rocmflash.attention``, ``flash_attn_func``, the torch op and ``patch_sdpa``:
    SDPA where the ``decode-`` entry of its KV-length and batch buckets timed it faster (eager, host time
    included), else the decode kernel; with gradients always the decode kernel (decode entries time inference)."""
    from rocmflash.api.incumbent import decode_host_floor, decode_timing, decode_winner, shape_excludes
    from rocmflash.api.selection import NO_INCUMBENT_ENV, incumbent_disabled

    key, field, why = decode_timing(gpu_name, head_dim, dtype, gqa_ratio, seqlen_k, batch, db_path)
    why = shape_excludes(causal, seqlen_q, seqlen_k, gqa_ratio) or why
    if incumbent_disabled():
        why = f"{NO_INCUMBENT_ENV} is set"
    floor = None if why else decode_host_floor(gpu_name, head_dim, dtype, db_path)
    backend, decided = (None, why) if why else decode_winner(field, floor)
    times = field or {}
    fwd = {"runs": f"SDPA ({backend})" if backend else DECODE_KERNEL, "sdpa_ms": times.get("time_ms"),
           "sdpa_backend": times.get("backend"), "rocmflash_ms": times.get("triton_ms"), "why": decided,
           "host_floor": {side: floor[side] for side in ("time_ms", "triton_ms")} if floor else None}
    train = {"runs": DECODE_KERNEL + " and the Triton backward", "sdpa_ms": None, "sdpa_backend": None,
             "rocmflash_ms": None, "why": "decode-shaped: decode entries time inference only"}
    return {"incumbent": field, "decode_entry": key, "batch": batch, "timing": times.get("timing"),
            "kvcache": KVCACHE_NOTE, "forward": fwd, "forward+backward": train,
            "timed_on": _timed_on(field, _decode_path(gpu_name, key, db_path))}


def _decode_path(gpu_name, key: Optional[str], db_path: Optional[str]) -> Optional[str]:
    """The file the decode entry ``key`` was read from (the first that holds it, as the lookup reads them)."""
    from rocmflash import db

    if key is None:
        return None
    for path in ([db_path] if db_path else db.database_paths(gpu_name)):
        try:
            if key in db.ConfigDB.read(path)["entries"]:
                return path
        except (db.DBError, OSError):
            continue
    return None


def _verdict(gpu: GPU, problem: Problem, cfg: KernelConfig, cache_dir: Optional[str]) -> dict:
    """Cross-compile ``cfg`` for the GPU's arch at the problem and judge it with the pruner's rules."""
    from rocmflash.static.compile import sweep
    from rocmflash.static.prune import judge

    (obs,), _ = sweep([cfg], problem, gpu, cache_dir=cache_dir, workers=1)
    verdict = judge(obs)
    kernels = obs.get("kernels") or []
    k = kernels[0] if kernels else {}
    return {"kept": verdict.kept, "reason": verdict.reason, "detail": verdict.detail,
            "vgprs": k.get("vgpr_count"), "agprs": k.get("agpr_count"), "spills": k.get("vgpr_spill_count"),
            "sgpr_spills": k.get("sgpr_spill_count"),
            "scratch_bytes": k.get("scratch_bytes"), "waves_per_simd": k.get("waves_per_simd")}


def _first_clean(gpu, problem, rows, choice, cache_dir, variant) -> Optional[dict]:
    """The first served candidate after the chosen one (then the default) that compiles without a rejection."""
    tried = [KernelConfig.from_dict(choice["config"])]
    for r in rows:
        if r["served"] and not r.get("chosen"):
            tried.append(KernelConfig.from_dict(r["config"]))
    tried.append(default_config(gpu.arch, problem.head_dim, variant))
    for cfg in tried[1:]:
        v = _verdict(gpu, problem, cfg, cache_dir)
        if v["kept"]:
            return {"config": cfg.to_dict(), "verdict": v}
    return None


def _label(cfg: Optional[dict]) -> str:
    if not cfg:
        return "-"
    from rocmflash.tuning.output import _label as tune_label

    return tune_label(cfg)


def print_explanation(result: dict, console) -> None:
    """Human-readable form of :func:`explain`'s result."""
    from rich.table import Table

    c = result["choice"]
    console.print(f"[bold]{result['asked']}[/bold] on {result['gpu']} ({result['arch']}), "
                  f"Sq={result['seqlen_q']} Sk={result['seqlen_k']}, variant {result['variant']}", highlight=False)
    if c["source"] == "db":
        off = "the asked bucket" if c["bucket_distance"] == 0 else \
            f"{c['bucket_distance']} bucket(s) away ({2 ** c['bucket_distance']}x in sequence length)"
        console.print(f"chosen: database entry {c['entry']} ({off}) from {c['path']}", highlight=False)
    else:
        console.print(f"chosen: the per-arch default for {result['arch']} ({c['why']})", highlight=False)
    console.print(f"config: {_label(c['config'])}", highlight=False)
    for side in ("forward", "forward+backward"):
        r = result["runs"][side]
        times = ""
        if r["sdpa_ms"] is not None and r["rocmflash_ms"] is not None:
            whose = "first-use" if (r.get("first_use") or {}).get("record") else "entry's"
            times = f" ({whose} times: SDPA {r['sdpa_backend']} {r['sdpa_ms']} ms vs rocmflash {r['rocmflash_ms']} ms)"
        console.print(f"{side} runs: {r['runs']}{times}: {r['why']}", highlight=False)
        fu = r.get("first_use")
        if fu and fu.get("record") is None:
            console.print(f"  first use ({fu['key']}): {fu['note']}", highlight=False)
        asked = r.get("asked")
        if asked:  # the call asked about, which the entry's shape rarely is
            sh = asked["shape"]
            at = f"B{sh['batch']} H{sh['heads_q']} Sq{sh['seqlen_q']} Sk{sh['seqlen_k']}"
            shown = (f"SDPA {asked['sdpa_ms']} ms vs rocmflash {asked['rocmflash_ms']} ms"
                     if asked["sdpa_ms"] is not None else "no estimate")
            console.print(f"  this call ({at}): {shown} ({asked['basis']})", highlight=False)
    if (result["runs"].get("timed_on") or {}).get("note"):
        console.print(f"incumbent: {result['runs']['timed_on']['note']}", highlight=False)
    if "decode_entry" in result["runs"]:
        runs = result["runs"]
        console.print(f"decode-shaped (batch {runs['batch']}): decided by decode entry {runs['decode_entry'] or '-'}"
                      + (f"; times: {runs['timing']}" if runs.get("timing") else "") + f"; {runs['kvcache']}",
                      highlight=False)
    for key, calls in (("varlen", "forward-only calls"), ("varlen_train", "calls that need gradients")):
        vl = result.get(key)
        if not vl or not vl["entry"]:
            continue
        times = f" (torch varlen_attn {vl['incumbent_ms']} ms vs rocmflash {vl['triton_ms']} ms)" \
            if vl["incumbent_ms"] is not None and vl["triton_ms"] is not None else ""
        runs = "torch varlen_attn" if vl["serves"] else "rocmflash's varlen kernels"
        console.print(f"flash_attn_varlen_func, {calls}: {runs}, by varlen entry {vl['entry']}{times}"
                      + (f": {vl['why']}" if vl["why"] else ""), highlight=False)
    table = Table(title="entries of this head dim, dtype, causal flag and GQA ratio")
    for col in ("bucket", "distance", "measured", "served", "best config", "TFLOP/s", "file", "note"):
        table.add_column(col)
    for r in result["candidates"]:
        table.add_row(f"s{r['bucket']}", str(r["distance"]), "yes" if r["measured"] else "no",
                      "CHOSEN" if r.get("chosen") else ("yes" if r["served"] else "no"), _label(r["config"]),
                      f"{r['tflops']:.1f}" if r.get("tflops") else "-", os.path.basename(r["path"]),
                      r["why_not"] or "")
    if result["candidates"]:
        console.print(table)
    else:
        console.print("no entry of this head dim, dtype, causal flag and GQA ratio in " +
                      ", ".join(result["databases"]), highlight=False)
    if result["other_groups"]:
        console.print("not used (another head dim, dtype, causal flag or GQA ratio builds another kernel): " +
                      "; ".join(f"d{o['head_dim']}-{o['dtype']}-{'causal' if o['causal'] else 'full'}-gqa"
                                f"{o['gqa_ratio']} (s{', s'.join(map(str, o['buckets']))})"
                                for o in result["other_groups"]), highlight=False)
    v = result.get("verdict")
    if v:
        console.print(f"on {result['arch']} at this problem: {v['vgprs']} VGPRs ({v['agprs'] or 0} AGPRs), "
                      f"{v['spills'] or 0} VGPR / {v['sgpr_spills'] or 0} SGPR spills, {v['scratch_bytes'] or 0} B scratch, "
                      f"{v['waves_per_simd']} waves/SIMD; pruner: "
                      f"{'kept' if v['kept'] else 'REJECTED'} ({v['reason'] or 'clean'})", highlight=False)
        if not v["kept"]:
            console.print(f"  {v['detail']}", highlight=False)
            fb = result.get("fallback")
            console.print("  first candidate that compiles clean: " +
                          (_label(fb["config"]) if fb else "none (every candidate is rejected)"), highlight=False)
    bc = result.get("build_check")
    if bc:
        console.print(f"first-use build check (run time, on {result['gpu']}): {bc['text']}", highlight=False)


__all__ = ["explain", "print_explanation"]
