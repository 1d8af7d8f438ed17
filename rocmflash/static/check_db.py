"""``rocmflash check-db --gpu NAME [--db PATH] [--fix] [--record] [--json]``: do a database's tuned configs still
hold under the installed compiler?

For every entry of the GPU's databases (the files run time reads, :func:`rocmflash.db.database_paths`: the user's,
then the shipped one; ``--db``: that file only), the served config and the alternatives the entry keeps (near-best
and ranked configs; every family: forward, fp8 forward, backward, decode, varlen forward and backward) are
cross-compiled for the GPU's arch with the installed Triton (:mod:`rocmflash.static.db_record`: the problem and
config the tune's static phase compiled, so a warm re-run reads the compile cache and compiles nothing), and each
build is compared with what the entry recorded when it was tuned (:func:`~rocmflash.static.profile.compare_profiles`).

A row's verdict:

* ``holds``: nothing got worse than the record (registers may have moved, which the row's ``now`` shows);
* ``drifted: <what>``: it now spills inside the loop, keeps fewer waves per SIMD, or spills past the harmless budget;
* ``fails to build``: the installed Triton cannot compile it for the arch;
* ``unrecorded, holds now`` / ``unrecorded, fails now: <why>``: a schema-1 entry (or row) with no record, judged
  by the build rules alone (it compiles, spills nothing costly, fits the LDS; an entry measured on a GPU: it
  compiles and spills nothing inside a loop, since its timing already paid for the rest); a schema-1 static
  entry's ``ranked`` row holds occupancy, VGPRs and LDS, and counts as the record of those;
* ``fails now as recorded: <why>``: nothing changed since the record, but the build spills inside a loop (a record
  of such a config, e.g. one a ``--fix`` replaced): it does not hold, and no fix serves it;
* ``cannot check: <why>``: the entry cannot be rebuilt here (malformed, of no known family, an unreadable problem).

The exit code is 1 when a served config no longer holds (after ``--fix``: when one still does not), or when its
compile could not run (timed out, its worker died: no evidence either way), else 0. A malformed entry (run time
skips it too) is a ``cannot check`` row and does not change the exit code.

``--fix`` rewrites the database (atomically, under the tune lock, :func:`rocmflash.db.files.atomic_write_json`)
so each entry whose served config does not hold serves the first alternative that holds now (near-best in time
order, then ranked in static order, then the arch default; a backward: per kernel), and records every config's
profile under the installed compiler. The tune's timings stay as they were; the entry says its winner changed
without a measurement (``"winner_changed_by": "check-db"``, ``"winner_replaced"``: the old config and why,
``"best_timed"``: whether the new config was timed in the tune, as a near-best row). Only entries that need it
are rewritten; every other entry keeps its bytes. ``--record`` writes the current profiles and compiler into the
entries that have no record (nothing served changes); ``--fix`` records only the entries it rewrites.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import time
from typing import Optional

from rocmflash.static.db_record import (Build, CannotCheck, default_builds, entry_builds, observe_builds,
                                        recorded_profile, set_path, write_record)
from rocmflash.static.profile import compare_profiles, profile_from_ranked_row, profile_label, static_profile

#: the pruner's rules an unrecorded build must pass to hold (as :data:`rocmflash.api.build_check.BUILD_RULES`:
#: it compiles, spills nothing that costs every iteration, fits the LDS; occupancy is what a measurement judged)
UNRECORDED_RULES = ("compile_failed", "spills", "lds_over_budget")
WINNER_CHANGED_BY = "check-db"


@dataclasses.dataclass
class Row:
    """One build checked: which file and entry, the build (:class:`~rocmflash.static.db_record.Build`), the profile
    then (the record; None: unrecorded) and now, and the verdict."""

    path: str
    key: str
    build: Optional[Build]
    then: Optional[dict]
    then_source: str  #: ``record``, ``ranked row`` or ``unrecorded``
    now: Optional[dict]
    verdict: str
    holds: Optional[bool]  #: None: unknown (the entry or its compile could not be checked)
    changes: list = dataclasses.field(default_factory=list)

    @property
    def served(self) -> bool:
        return self.build is None or self.build.role == "best"

    def to_dict(self) -> dict:
        b = self.build
        return {"path": self.path, "key": self.key, "build": b.label if b else None, "served": self.served,
                "config": b.config if b else None, "then": self.then, "then_source": self.then_source,
                "now": self.now, "verdict": self.verdict, "holds": self.holds, "changes": self.changes}


# ---------------------------------------------------------------------- judging one build
def judge_build(then: Optional[dict], observation: dict, measured: bool = False) -> tuple:
    """``(verdict, holds, changes)`` of one build compiled now against its record ``then`` (None: unrecorded).

    Recorded: what got worse since the record (:func:`~rocmflash.static.profile.compare_profiles`) is its drift,
    and a build that spills inside a loop (the assembly shows it) never holds, even where its record says so too
    (a record written by ``--fix`` or ``--record`` is the compiler's truth, not an approval): a fix never picks it.
    Unrecorded: an unmeasured entry's build must pass :data:`UNRECORDED_RULES` now; a ``measured`` one (timed on a
    GPU, which a spill of unknown place or an occupancy below the floor did not stop from winning: e.g. the H100
    backward's per-arch default, always timed) only has to build without an in-loop spill."""
    now = static_profile(observation)
    if observation.get("transient"):  # a timeout or a dead worker says nothing about the config: unknown
        return f"cannot check: {now.get('error')}", None, []
    if now["status"] != "ok":
        return "fails to build", False, []
    in_loop = (f"spills: {now.get('scratch_loop_ops')} scratch ops in the loop, {now.get('scratch_bytes')} B/lane"
               if now.get("spills_in_loop") else None)
    if then is None:
        broken = in_loop if measured else _build_rule(observation)
        if broken is not None:
            return f"unrecorded, fails now: {broken}", False, []
        return "unrecorded, holds now", True, []
    regressions, changes = compare_profiles(then, now)
    if regressions:
        return "drifted: " + "; ".join(regressions), False, changes
    if in_loop is not None:
        return f"fails now as recorded: {in_loop}", False, changes
    return "holds", True, changes


def _build_rule(observation: dict) -> Optional[str]:
    """``"<reason>: <detail>"`` of the first of :data:`UNRECORDED_RULES` that rejects the build now, or None."""
    from rocmflash.static import prune

    return prune.first_rejection(observation, UNRECORDED_RULES)


def _then(entry: dict, build: Build) -> tuple:
    """``(profile, source)`` the build is compared with: the entry's record, else (schema 1) the ``ranked`` row of
    the same config, else ``(None, "unrecorded")``."""
    profile = recorded_profile(entry, build)
    if profile is not None:
        return profile, "record"
    if build.kernel is None and isinstance(entry.get("ranked"), list):
        for row in entry["ranked"]:
            if isinstance(row, dict) and isinstance(row.get("config"), dict) and _same(row["config"], build.config):
                partial = profile_from_ranked_row(row)
                if partial is not None:
                    return partial, "ranked row"
    return None, "unrecorded"


def _same(stored: dict, config: dict) -> bool:
    from rocmflash.config import KernelConfig

    try:
        return KernelConfig.from_dict(stored).to_dict() == config
    except (TypeError, ValueError):
        return False


# ---------------------------------------------------------------------- checking a database
@dataclasses.dataclass
class FileCheck:
    """One database file checked: its rows, the raw data read, and per entry its builds and observations."""

    path: str
    raw: bytes
    data: dict
    rows: list
    builds: dict  #: ``{key: [(build, observation), ...]}`` of the entries that could be checked
    usable: dict  #: ``{key: checked entry}``


def check_file(gpu, path: str, cache_dir: Optional[str] = None, workers: Optional[int] = None,
               stats: Optional[dict] = None) -> FileCheck:
    """Check every entry of one database file (see the module docstring); ``stats`` (if given) sums the compiles."""
    from rocmflash.db import servable
    from rocmflash.db.entries import check_entries
    from rocmflash.db.files import ConfigDB

    with open(path, "rb") as f:
        raw = f.read()
    data = ConfigDB.parse(path, raw)
    checked = check_entries(path, data["entries"], warn=False)
    rows, per_entry, plans = [], {}, []
    for key, why in checked.malformed.items():
        rows.append(Row(path, key, None, None, "unrecorded", None, f"cannot check: {why}", None))
    for key, entry in checked.usable.items():
        try:
            builds = entry_builds(gpu, key, entry)
        except CannotCheck as err:
            rows.append(Row(path, key, None, None, "unrecorded", None, f"cannot check: {err}", None))
            continue
        plans.append((key, builds))
    all_builds = [b for _, builds in plans for b in builds]
    observations, st = observe_builds(gpu, all_builds, cache_dir, workers)
    _add_stats(stats, st)
    position = 0
    for key, builds in plans:
        obs = observations[position:position + len(builds)]
        position += len(builds)
        per_entry[key] = list(zip(builds, obs))
        entry = checked.usable[key]
        for build, observation in per_entry[key]:
            then, source = _then(entry, build)
            verdict, holds, changes = judge_build(then, observation, servable(entry))
            rows.append(Row(path, key, build, then, source, static_profile(observation), verdict, holds, changes))
    order = {key: i for i, key in enumerate(data["entries"])}
    rows.sort(key=lambda r: order.get(r.key, len(order)))  # file order; an entry's rows keep theirs (stable)
    return FileCheck(path, raw, data, rows, per_entry, checked.usable)


def _add_stats(total: Optional[dict], part: dict) -> None:
    if total is not None:
        for name, value in part.items():
            total[name] = total.get(name, 0) + value


def served_failures(check: FileCheck) -> list:
    """Keys of the entries whose served config (any of its kernels) does not hold."""
    return sorted({r.key for r in check.rows if r.served and r.build is not None and r.holds is False},
                  key=list(check.data["entries"]).index)


def served_unknown(check: FileCheck) -> list:
    """Keys of the entries whose served config could not be judged (its compile timed out or its worker died)."""
    return [key for key in dict.fromkeys(r.key for r in check.rows if r.served and r.build is not None
                                         and r.holds is None) if key not in served_failures(check)]


# ---------------------------------------------------------------------- the fix
def fix_entry(gpu, key: str, check: FileCheck, cache_dir=None, workers=None, stats=None) -> Optional[dict]:
    """What to store under ``key`` so its served config holds: ``{"replaced": {build label: new config label},
    "entry": the new stored entry}``, or None when no alternative and not the arch default holds."""
    entry = copy.deepcopy(check.data["entries"][key])
    rows = {(r.build.role, r.build.kernel, r.build.index): r for r in check.rows
            if r.key == key and r.build is not None}
    served = [r for r in rows.values() if r.served]
    defaults = None
    replaced = {}
    for old in served:
        if old.holds is not False:
            continue
        # the alternatives in the order the entry keeps them (near-best by time, then ranked): the first that holds
        choice = next((r for r in rows.values() if not r.served and r.holds is True
                       and r.build.kernel == old.build.kernel and r.build.config != old.build.config), None)
        if choice is None:
            if defaults is None:
                defaults = _check_defaults(gpu, key, check, cache_dir, workers, stats)
            choice = next((r for r in defaults if r.holds is True and r.build.kernel == old.build.kernel), None)
        if choice is None:
            return None
        _serve(entry, old, choice)
        replaced[old.build.label] = choice
    from rocmflash.static.profile import compiler_identity

    pairs = check.builds[key]  # every config's profile under the installed compiler: the record the fix rests on
    write_record(entry, [b for b, _ in pairs], [o for _, o in pairs], compiler_identity(gpu.triton_target().backend))
    for old in served:  # the served profile is the new config's (write_record wrote the old one's)
        choice = replaced.get(old.build.label)
        if choice is not None:
            path = ("static_profile", old.build.kernel) if old.build.kernel else ("static_profile",)
            set_path(entry, path, choice.now)
    entry["winner_changed_by"] = WINNER_CHANGED_BY
    entry["winner_replaced"] = {"best": copy.deepcopy(check.data["entries"][key].get("best")),
                                "why": {label: next(o.verdict for o in served if o.build.label == label)
                                        for label in replaced},
                                "by": {label: r.build.label for label, r in replaced.items()}, "when": _now()}
    # the tune timed a near-best row; an unmeasured entry, a ranked row or the arch default was never timed
    entry["best_timed"] = bool(entry.get("measured")) and all(r.build.role == "near_best" for r in replaced.values())
    return {"replaced": {label: r.build.label for label, r in replaced.items()}, "entry": entry}


def _now() -> str:
    from rocmflash.db.files import now_iso

    return now_iso()


def _check_defaults(gpu, key: str, check: FileCheck, cache_dir, workers, stats) -> list:
    """The arch default's rows (judged by the build rules: no record), compiled now."""
    try:
        builds = default_builds(gpu, key, check.usable[key])
    except (CannotCheck, KeyError, TypeError, ValueError):
        return []
    observations, st = observe_builds(gpu, builds, cache_dir, workers)
    _add_stats(stats, st)
    out = []
    for build, obs in zip(builds, observations):
        verdict, holds, changes = judge_build(None, obs)
        out.append(Row(check.path, key, build, None, "unrecorded", static_profile(obs), verdict, holds, changes))
    return out


def _serve(entry: dict, old: Row, choice: Row) -> None:
    """Make ``choice``'s config the served one in place of ``old``'s (one kernel of a backward)."""
    b = choice.build
    if old.build.kernel is not None:  # a backward kernel: head splits come with a near-best dK/dV row
        entry["best"][old.build.kernel] = b.config
        if old.build.kernel == "dkdv":
            entry["best"]["head_splits"] = int((b.row or {}).get("head_splits", 0) or 0)
        return
    new = dict(b.config)
    if "BLOCK_M" not in new or "variant" not in new:  # decode: the split count timed with it (0: chosen per call)
        new["num_splits"] = int((b.row or {}).get("num_splits", 0) or 0)
    old_best = entry.get("best")
    entry["best"] = new
    per = entry.get("best_per_variant")
    if isinstance(per, dict) and isinstance(old_best, dict):  # the forward's per-variant choice served the old one too
        for variant, vrow in list(per.items()):
            if isinstance(vrow, dict) and _same(vrow.get("config") or {}, old.build.config):
                if new.get("variant", "online") == variant:
                    per[variant] = {"config": new, "tflops": (b.row or {}).get("tflops")}
                else:
                    del per[variant]  # nothing checked serves this variant now: run time falls back for it


# ---------------------------------------------------------------------- writing
def rewrite(path: str, raw_before: bytes, new_entries: dict, served_changed: bool) -> None:
    """Replace ``new_entries`` (``{key: entry}``) in the database at ``path`` atomically, under the tune lock; the
    rest of the file is kept as read (order, every other entry's bytes). ``schema_version`` becomes the current
    one; ``updated`` only when a served config changed. ``DBError`` when the file changed since it was checked."""
    from rocmflash import db
    from rocmflash.db.files import SCHEMA_VERSION, DBError, atomic_write_json, now_iso, tune_lock

    lock = tune_lock(path)
    try:
        with open(path, "rb") as f:
            raw = f.read()
        if raw != raw_before:
            raise DBError(f"{path} changed while it was being checked; run check-db again")
        data = json.loads(raw.decode("utf-8"))
        data["schema_version"] = SCHEMA_VERSION
        if served_changed:
            data["updated"] = now_iso()
        data["entries"] = {key: new_entries.get(key, entry) for key, entry in data["entries"].items()}
        atomic_write_json(path, data)
    finally:
        lock.release()
    db.clear_cache()


# ---------------------------------------------------------------------- the command
def database_files(gpu, db_path: Optional[str]) -> list:
    """The files to check: ``db_path`` (checked: a readable database of this GPU), else the existing files run
    time reads for the GPU; ValueError (one line) when there are none or ``db_path`` cannot be used."""
    from rocmflash.db import database_paths
    from rocmflash.db.files import ConfigDB

    if db_path is not None:
        if os.path.isdir(db_path):
            raise ValueError(f"--db {db_path} is a directory; --db takes a database file such as {gpu.name}.json")
        if not os.path.isfile(db_path):
            raise ValueError(f"--db {db_path}: no such file")
        paths = [db_path]
    else:
        paths = [p for p in database_paths(gpu.name) if os.path.isfile(p)]
        if not paths:
            raise ValueError(f"no config database for {gpu.name}: looked in {', '.join(database_paths(gpu.name))}; "
                             "pass --db")
    for path in paths:
        data = ConfigDB.read(path)  # DBError (a ValueError): not JSON, another format or schema
        if data.get("gpu") != gpu.name:
            raise ValueError(f"{path} holds configs for {data.get('gpu')!r}, not {gpu.name!r}")
    return paths


def load_explained(path: Optional[str]) -> list:
    """The drifts an ``--explained`` file accepts: ``{"explained": [{"triton": "3.9", "gpu": "mi300x", "key":
    "<entry key>", "why": "<sentence>"}, ...]}`` (``triton``: a version prefix, ``3.9`` matches ``3.9.0``). A
    missing, malformed or incomplete file is a one-line ``ValueError``."""
    if path is None:
        return []
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"--explained {path}: cannot read it ({type(err).__name__}: {err})") from None
    items = data.get("explained") if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise ValueError(f"--explained {path}: expected an object with an \"explained\" list")
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not all(isinstance(item.get(k), str) and item.get(k)
                                                 for k in ("triton", "gpu", "key", "why")):
            raise ValueError(f"--explained {path}: item {i} needs non-empty strings triton, gpu, key and why")
    return items


def explanation(explained: list, triton: str, gpu: str, key: str) -> Optional[str]:
    """The ``why`` of the first item that accepts this entry's drift under this Triton, or None."""
    for item in explained:
        version = item["triton"]
        if item["gpu"] == gpu and item["key"] == key and (triton == version or triton.startswith(version + ".")):
            return item["why"]
    return None


def run(gpu_name: str, db_path: Optional[str] = None, fix: bool = False, record: bool = False,
        cache_dir: Optional[str] = None, workers: Optional[int] = None, explained: Optional[list] = None) -> dict:
    """Check (and with ``fix``/``record`` rewrite) the GPU's databases; the report as a dict::

        {"gpu", "arch", "compiler", "files", "rows": [Row.to_dict()...], "fixed": {path: {key: {label: by}}},
         "unfixable": [[path, key], ...], "recorded": {path: [key, ...]}, "failing": [[path, key], ...],
         "unchecked": [[path, key], ...] (served, compile timed out or its worker died),
         "explained": [[path, key, why], ...] (failing, but accepted by ``explained``: not in "failing"),
         "stale": [item, ...] (``explained`` items for this GPU and Triton whose entry holds now),
         "stats": {"configs", "compiled", "cache_hits", "seconds"}, "seconds", "exit_code"}

    ``explained`` (:func:`load_explained`): drifts known and explained for a Triton (e.g. CI's second Triton);
    they are reported but do not make the exit code 1.
    """
    from rocmflash.hw.gpus import get_gpu
    from rocmflash.static.profile import compiler_identity

    start = time.perf_counter()
    gpu = get_gpu(gpu_name)
    paths = database_files(gpu, db_path)
    compiler = compiler_identity(gpu.triton_target().backend)
    stats: dict = {}
    report = {"gpu": gpu.name, "arch": gpu.arch, "compiler": compiler, "files": paths, "rows": [], "fixed": {},
              "unfixable": [], "recorded": {}, "failing": [], "unchecked": [], "explained": [], "stale": []}
    explained = explained or []
    for path in paths:
        check = check_file(gpu, path, cache_dir, workers, stats)
        report["rows"] += [r.to_dict() for r in check.rows]
        failing = served_failures(check)
        new_entries, still = {}, []
        if fix:
            for key in failing:
                fixed = fix_entry(gpu, key, check, cache_dir, workers, stats)
                if fixed is None:
                    still.append(key)
                    report["unfixable"].append([path, key])
                else:
                    new_entries[key] = fixed["entry"]
                    report["fixed"].setdefault(path, {})[key] = fixed["replaced"]
        else:
            still = failing
        for key in still:
            why = explanation(explained, str(compiler.get("triton")), gpu.name, key)
            if why is None:
                report["failing"].append([path, key])
            else:
                report["explained"].append([path, key, why])
        report["unchecked"] += [[path, key] for key in served_unknown(check)]
        if record:
            for key, pairs in check.builds.items():
                stored = check.data["entries"][key]
                if key in new_entries or stored.get("compiler") is not None:
                    continue
                entry = copy.deepcopy(stored)
                write_record(entry, [b for b, _ in pairs], [o for _, o in pairs], compiler)
                new_entries[key] = entry
                report["recorded"].setdefault(path, []).append(key)
        if new_entries:
            rewrite(path, check.raw, new_entries, served_changed=bool(report["fixed"].get(path)))
    accepted = {key for _, key, _ in report["explained"]}
    report["stale"] = [item for item in explained
                       if explanation([item], str(compiler.get("triton")), gpu.name, item["key"]) is not None
                       and item["key"] not in accepted]
    report["stats"] = stats
    report["seconds"] = round(time.perf_counter() - start, 2)
    # a served config whose compile could not run is no evidence that it holds: CI must not pass on a timeout
    report["exit_code"] = 1 if report["failing"] or report["unchecked"] else 0
    return report


# ---------------------------------------------------------------------- printing
def print_report(report: dict, console) -> None:
    """The drift table (entry, config, then, now, verdict; rich, wraps to the console's width) and a summary."""
    from rich import box
    from rich.table import Table

    compiler = report["compiler"]
    llvm = compiler.get("llvm_hash") or compiler.get("producer") or "?"
    table = Table(title=f"check-db {report['gpu']} ({report['arch']}): Triton {compiler.get('triton')}, "
                        f"LLVM {str(llvm)[:12]}", title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1),
                  expand=False)
    for name, style in (("entry", "cyan"), ("config", None), ("then", None), ("now", None), ("verdict", None)):
        table.add_column(name, style=style, overflow="fold")
    previous = None
    for row in report["rows"]:
        entry = row["key"] if (row["path"], row["key"]) != previous else ""
        previous = (row["path"], row["key"])
        verdict = row["verdict"]
        style = {True: "green", None: "yellow"}.get(row["holds"], "red" if row["served"] else "yellow")
        then = profile_label(row["then"]) if row["then"] else "unrecorded"
        table.add_row(entry, _config_cell(row), then, profile_label(row["now"]) if row["now"] else "-",
                      f"[{style}]{_escape(short_verdict(verdict))}[/{style}]")
    console.print(table)
    for path, keys in report["fixed"].items():
        for key, replaced in keys.items():
            what = ", ".join(f"{label} -> {by}" for label, by in replaced.items())
            console.print(f"fixed {key}: serves {what} (not re-timed; marked winner_changed_by={WINNER_CHANGED_BY})",
                          highlight=False)
    for path, keys in report["recorded"].items():
        console.print(f"recorded {len(keys)} entr{'y' if len(keys) == 1 else 'ies'} in {path}", highlight=False)
    for path, key, why in report.get("explained", []):
        console.print(f"[yellow]explained drift {key}: {_escape(why)}[/yellow]", highlight=False)
    for item in report.get("stale", []):
        console.print(f"[yellow]explained drift {item['key']} no longer occurs (the entry holds now): the "
                      "explanation can go[/yellow]", highlight=False)
    for path, key in report["unfixable"]:
        console.print(f"[red]cannot fix {key}: no alternative and not the arch default holds; left as it is[/red]")
    st = report["stats"]
    served = [r for r in report["rows"] if r["served"]]
    hold = sum(1 for r in served if r["holds"] is True)
    unknown = sum(1 for r in served if r["holds"] is None)
    console.print(f"{len(served)} served config(s): {hold} hold, {len(served) - hold - unknown} do not, "
                  f"{unknown} cannot be checked; "
                  f"{st.get('configs', 0)} build(s) checked ({st.get('compiled', 0)} compiled, "
                  f"{st.get('cache_hits', 0)} from the cache) in {report['seconds']:.1f} s", highlight=False)


def short_verdict(verdict: str) -> str:
    """A verdict for the table: a rule's reason without its detail (``--json`` has the whole sentence)."""
    for prefix in ("fails now as recorded: ", "unrecorded, fails now: "):
        if verdict.startswith(prefix):
            return prefix + verdict[len(prefix):].split(":", 1)[0]
    return verdict


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def _config_cell(row: dict) -> str:
    """``best 128x64 w8 s1 wpe3 m16 k2`` (``nb1``: near-best row 1, ``r3``: ranked row 3; a backward: its kernel)."""
    label = row["build"] or "-"
    cfg = row["config"]
    if not cfg:
        return _escape(label)
    short = label.replace("near_best[", "nb").replace("ranked[", "r").replace("]", "")
    return _escape(f"{short} {config_label(cfg)}")


def config_label(cfg: dict) -> str:
    """A stored config in a few characters: ``128x64 w8 s1 wpe3 m16 k2`` (a variant other than online named), a
    decode config ``BN32 w8 s1``."""
    if "BLOCK_M" not in cfg or "variant" not in cfg:
        text = f"BN{cfg.get('BLOCK_N')} w{cfg.get('num_warps')} s{cfg.get('num_stages')}"
        return text + (f" wpe{cfg['waves_per_eu']}" if cfg.get("waves_per_eu") else "")
    from rocmflash.tuning.varlen import config_label as tile_label

    text = tile_label(cfg)
    return text + (f" {cfg['variant']}" if cfg.get("variant", "online") != "online" else "")


def main(args) -> int:
    """The CLI command (arguments of :func:`add_parser`)."""
    from rich.console import Console

    report = run(args.gpu, args.db, fix=args.fix, record=args.record, cache_dir=args.cache_dir, workers=args.workers,
                 explained=load_explained(args.explained))
    if args.json:
        print(json.dumps(report, indent=1, default=str))
    else:
        print_report(report, Console())
    return report["exit_code"]


def add_parser(sub) -> None:
    """``check-db``'s sub-command and flags."""
    from rocmflash.cli.tune import int_at_least

    p = sub.add_parser(
        "check-db", help="do a database's tuned configs still hold under the installed Triton? (CPU only)",
        description="Cross-compile every entry's served config and its near-best/ranked alternatives for the GPU's "
                    "arch with the installed Triton (no GPU needed), compare each with the profile the entry "
                    "recorded when it was tuned, and print entry, config, then, now and verdict. Exit code 1 when "
                    "a served config no longer holds.")
    p.add_argument("--gpu", required=True, help="catalog name, e.g. mi300x (see `rocmflash gpus`)")
    p.add_argument("--db", default=None, metavar="PATH",
                   help="check this database only (default: the files run time reads for the GPU, the user's then "
                        "the shipped one)")
    p.add_argument("--fix", action="store_true",
                   help="rewrite the database so each entry serves the best config that holds now (the next "
                        "near-best/ranked one, else the arch default); timings are kept and the entry is marked "
                        "winner_changed_by=check-db; only entries that need it are rewritten")
    p.add_argument("--record", action="store_true",
                   help="write the current profiles and compiler into the entries that have no record (what they "
                        "serve does not change)")
    p.add_argument("--json", action="store_true", help="print the rows and the summary as JSON")
    p.add_argument("--explained", default=None, metavar="FILE",
                   help="JSON of drifts known and explained per Triton ({\"explained\": [{\"triton\", \"gpu\", "
                        "\"key\", \"why\"}]}): reported, but no exit code 1 (CI's second Triton)")
    p.add_argument("--cache-dir", default=None, metavar="DIR",
                   help="compile cache (default $ROCMFLASH_CACHE_DIR or the user cache dir)")
    p.add_argument("--workers", type=int_at_least(1), default=None, metavar="N",
                   help="compile processes (default: CPUs)")


def check_args(args) -> None:
    """One-line errors before any compile: an unknown GPU (the line lists the known ones), an unusable --db or
    --cache-dir."""
    from rocmflash.cli.tune_args import check_cache_dir
    from rocmflash.hw.gpus import get_gpu

    database_files(get_gpu(args.gpu), args.db)
    check_cache_dir(args.cache_dir)
    load_explained(args.explained)


__all__ = ["Row", "FileCheck", "judge_build", "check_file", "served_failures", "fix_entry", "rewrite",
           "database_files", "load_explained", "explanation", "run", "print_report", "config_label", "main",
           "add_parser", "check_args",
           "UNRECORDED_RULES", "WINNER_CHANGED_BY"]
