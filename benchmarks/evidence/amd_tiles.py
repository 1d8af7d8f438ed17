"""AMD's published forward tiles on rocmflash's ``online`` kernel: registers before/after a kernel change.

Cross-compiles (CPU only, no GPU) the ``online`` forward kernel at every forward config
AMD publishes for an arch (``rocmflash/reference/amd_published.json``: aiter, ROCm/triton
perf-kernels, ROCm/flash-attention, vLLM), plus the ``matrix_instr_nonkdim``/``kpack``
siblings of the 128x64 w4 s1 wpe2 default, for D = 64 and 128, causal and not, bf16 and
fp16, on gfx942 and gfx950, twice:

* **before**: the kernel at a git ref (default ``HEAD``): ``rocmflash/kernels/forward/online.py``
  and ``rocmflash/kernels/common.py`` of that ref, loaded as a private package;
* **after**: the kernel of the working tree (``rocmflash.kernels.forward.online``).

Each build is read with ``isa_tools`` (VGPR, AGPR, VGPR spills, scratch, waves/SIMD from
the occupancy model). Prints one markdown table (``--out`` also writes it) and a summary
of which configs spill before and after.

    python benchmarks/evidence/amd_tiles.py                         # default tiles, both archs (about 5 min on 2 cores, cold cache)
    python benchmarks/evidence/amd_tiles.py --set all               # every published forward config (about 10 min cold)
    python benchmarks/evidence/amd_tiles.py --arch gfx942 --head-dim 128 --dtype bf16
    python benchmarks/evidence/amd_tiles.py --buffer-ops            # model a ROCm launch of tensors < 2 GB (see below)
    python benchmarks/evidence/amd_tiles.py --out /tmp/amd-tiles.md

``--buffer-ops``: on a ROCm launch Triton marks every pointer argument whose tensor storage
is below 2 GB with ``tt.pointer_range = 32`` (``HIPBackend.get_tensor_specialization``;
``AMDGCN_USE_BUFFER_OPS`` defaults on), and the AMD backend then turns loads into buffer
loads with 32-bit offsets. rocmflash's compile-only builds do not add that attribute (they
model tensors of any size); this flag adds it to every pointer so that the table shows
what a typical launch gets.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime
import importlib
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, ROOT)

ARCHS = ("gfx942", "gfx950")
HEAD_DIMS = (64, 128)
DTYPES = ("bf16", "fp16")

#: the 128x64 w4 s1 wpe2 tile AMD ships as its default (aiter fwd.default, perf-kernels #1): the
#: ``matrix_instr_nonkdim``/``kpack`` siblings are compiled too (AMD gives no nonkdim: 0 = Triton's pick)
DEFAULT_TILE = dict(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=1, waves_per_eu=2)
SIBLINGS = ((0, 1), (16, 1), (16, 2), (32, 1), (32, 2))


def tiles(arch: str, which: str) -> list:
    """``[(label, sources, KernelConfig)]`` for ``arch``: ``default`` = the wpe>=2 tiles AMD uses as defaults
    for this arch and the siblings of 128x64 wpe2; ``all`` = every published forward config as well."""
    from rocmflash.config import KernelConfig
    from rocmflash.static.reference import load

    out: dict = {}

    def add(cfg: KernelConfig, source: str) -> None:
        key = cfg.to_json()
        if key not in out:
            out[key] = [cfg, []]
        if source not in out[key][1]:
            out[key][1].append(source)

    for plv in (False, True):
        for nonk, kp in SIBLINGS:
            add(KernelConfig(**DEFAULT_TILE, PRE_LOAD_V=plv, matrix_instr_nonkdim=nonk, kpack=kp), "sibling")
    for ref in load():
        if ref.pass_ != "fwd" or ref.arch != arch or ref.rocmflash is None:
            continue
        cfg = ref.rocmflash.replace(variant="online")
        if which == "default" and not (ref.role == "default" and cfg.waves_per_eu >= 2):
            continue
        add(cfg, ref.id)
    rows = []
    for cfg, sources in out.values():
        named = [s for s in sources if s != "sibling"]
        label = (f"{cfg.BLOCK_M}x{cfg.BLOCK_N} w{cfg.num_warps} s{cfg.num_stages} wpe{cfg.waves_per_eu} "
                 f"mfma{cfg.matrix_instr_nonkdim} kp{cfg.kpack}" + (" plv" if cfg.PRE_LOAD_V else ""))
        rows.append((label, ", ".join(named) if named else "sibling of 128x64 wpe2", cfg))
    rows.sort(key=lambda r: (-r[2].BLOCK_M, -r[2].BLOCK_N, r[2].num_warps, r[2].num_stages, r[2].waves_per_eu,
                             r[2].PRE_LOAD_V, r[2].matrix_instr_nonkdim, r[2].kpack))
    return rows


# ----------------------------------------------------------------------------- the two kernels
def _git_show(ref: str, path: str) -> str:
    return subprocess.run(["git", "-C", ROOT, "show", f"{ref}:{path}"], check=True, capture_output=True,
                          text=True).stdout


_BEFORE: dict = {}


def before_module(ref: str):
    """``online`` as it is at ``ref``, with that ref's ``common`` (a private package in a temp dir)."""
    if ref in _BEFORE:
        return _BEFORE[ref]
    pkg = "_rocmflash_at_" + "".join(c if c.isalnum() else "_" for c in ref)
    where = os.path.join(tempfile.gettempdir(), f"rocmflash-amd-tiles-{os.getuid()}", pkg)
    os.makedirs(where, exist_ok=True)
    common = _git_show(ref, "rocmflash/kernels/common.py")
    online = _git_show(ref, "rocmflash/kernels/forward/online.py")
    online = online.replace("from rocmflash.kernels import common as C", f"from {pkg} import common as C")
    online = online.replace("from rocmflash.kernels.common import kernel_jit", f"from {pkg}.common import kernel_jit")
    for name, text in (("__init__.py", ""), ("common.py", common), ("online.py", online)):
        path = os.path.join(where, name)
        if not os.path.exists(path) or open(path).read() != text:  # keep mtimes: Triton caches by source
            with open(path, "w") as f:
                f.write(text)
    sys.path.insert(0, os.path.dirname(where))
    mod = importlib.import_module(f"{pkg}.online")
    _BEFORE[ref] = mod
    return mod


def after_module():
    from rocmflash.kernels.forward import online as online

    return online


# ----------------------------------------------------------------------------- one build
def _with_buffer_ops():
    """Patch ``triton.compile`` in this worker so that pointer arguments carry ``tt.pointer_range = 32``."""
    import triton

    if getattr(triton.compile, "_amd_tiles_patched", False):
        return
    original = triton.compile

    def compile_(src, *args, **kwargs):
        for i, name in enumerate(src.fn.arg_names):
            if str(src.signature.get(name, "")).startswith("*"):
                attrs = src.attrs.setdefault((i,), [])
                if ["tt.pointer_range", 32] not in attrs:
                    attrs.append(["tt.pointer_range", 32])
        return original(src, *args, **kwargs)

    compile_._amd_tiles_patched = True
    triton.compile = compile_
    import triton.compiler

    triton.compiler.compile = compile_


def build(job: tuple) -> dict:
    """Worker: compile one (kernel, arch, config, problem) and read its registers."""
    which, ref, arch, cfg_json, head_dim, causal, dtype, buffer_ops = job
    from isa_tools import read_code_object
    from isa_tools.summary import kernel_summary

    from rocmflash.config import KernelConfig, Problem

    if buffer_ops:
        _with_buffer_ops()
    mod = before_module(ref) if which == "before" else after_module()
    cfg = KernelConfig.from_json(cfg_json)
    try:
        k = mod.compile_for(arch, cfg, Problem(head_dim=head_dim, causal=causal, dtype=dtype))[0]
    except Exception as e:  # a compile failure is a result, not a crash
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}"}
    res = read_code_object(k.asm["hsaco"])[0]
    s = kernel_summary(res, dynamic_lds_bytes=k.metadata.shared, num_warps=cfg.num_warps)
    keys = ("vgpr_count", "agpr_count", "vgpr_spill_count", "sgpr_spill_count", "scratch_bytes", "waves_per_simd")
    return {key: s[key] for key in keys} | {"text": text_hash(k.asm["hsaco"])}


def text_hash(hsaco: bytes) -> str:
    """sha256 of the code object's ``.text`` (machine code only: the debug sections name the source file)."""
    import hashlib
    import io

    from elftools.elf.elffile import ELFFile

    return hashlib.sha256(ELFFile(io.BytesIO(hsaco)).get_section_by_name(".text").data()).hexdigest()


def cell(r: dict) -> str:
    if "error" in r:
        return "compile error"
    spill = r["vgpr_spill_count"] + r["sgpr_spill_count"]
    sp = f"**{spill}**" if spill else "0"
    return f"{r['vgpr_count']}/{r['agpr_count']}, {sp}, {r['waves_per_simd']}"


def spills(r: dict) -> bool:
    return "error" in r or r["vgpr_spill_count"] + r["sgpr_spill_count"] > 0 or r["scratch_bytes"] > 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", default="HEAD", help="git ref of the 'before' kernel (default HEAD)")
    ap.add_argument("--set", choices=("default", "all"), default="default")
    ap.add_argument("--arch", nargs="+", default=list(ARCHS))
    ap.add_argument("--head-dim", type=int, nargs="+", default=list(HEAD_DIMS))
    ap.add_argument("--dtype", nargs="+", default=list(DTYPES))
    ap.add_argument("--causal", choices=("both", "yes", "no"), default="both")
    ap.add_argument("--buffer-ops", action="store_true", help="pointers marked < 2 GB, as a typical ROCm launch")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--out", help="also write the markdown here")
    a = ap.parse_args(argv)

    import triton

    causals = {"both": (False, True), "yes": (True,), "no": (False,)}[a.causal]
    rows = []
    for arch in a.arch:
        for label, source, cfg in tiles(arch, a.set):
            for D in a.head_dim:
                for causal in causals:
                    for dt in a.dtype:
                        rows.append((arch, label, source, cfg, D, causal, dt))
    jobs = [(w, a.before, arch, cfg.to_json(), D, causal, dt, a.buffer_ops)
            for (arch, label, source, cfg, D, causal, dt) in rows for w in ("before", "after")]
    t0 = time.time()
    with cf.ProcessPoolExecutor(a.workers) as ex:
        results = list(ex.map(build, jobs, chunksize=1))
    elapsed = time.time() - t0

    head = [
        f"# rocmflash `online` at AMD's published forward tiles: before/after ({datetime.date.today().isoformat()})",
        "",
        f"Triton {triton.__version__}, cross-compiled on this CPU (no GPU). Command: `python benchmarks/evidence/amd_tiles.py "
        + " ".join(argv if argv is not None else sys.argv[1:]) + "`"
        + f" ({len(jobs)} builds, {elapsed:.0f} s).",
        f"Before = the kernel at `{a.before}`; after = the working tree."
        + (" Pointers marked < 2 GB (`tt.pointer_range=32`): buffer loads, as a typical ROCm launch."
           if a.buffer_ops else " Pointers of any size (global loads; rocmflash's compile-only model)."),
        "Cells: VGPR/AGPR (`.vgpr_count` counts both), spills (VGPR+SGPR; bold when > 0), waves/SIMD "
        "(isa_tools occupancy model).",
        "",
        "| arch | config | D | causal | dtype | before | after | changed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines = []
    summary = {"before": 0, "after": 0, "total": 0, "same_binary": 0}
    for i, (arch, label, source, cfg, D, causal, dt) in enumerate(rows):
        b, f = results[2 * i], results[2 * i + 1]
        summary["total"] += 1
        summary["before"] += spills(b)
        summary["after"] += spills(f)
        same = "error" not in b and "error" not in f and b["text"] == f["text"]
        summary["same_binary"] += same
        lines.append(f"| {arch} | {label} | {D} | {'yes' if causal else 'no'} | {dt} | {cell(b)} | {cell(f)} | "
                     f"{'same code' if same else ''} |")
    tail = ["", f"Spilling (or failing) builds: before {summary['before']} of {summary['total']}, "
                f"after {summary['after']} of {summary['total']}; "
                f"{summary['same_binary']} with identical machine code (`.text`).", ""]
    srcs = {}
    for arch, label, source, cfg, D, causal, dt in rows:
        srcs.setdefault((arch, label), source)
    tail += ["Sources of each config (`rocmflash/reference/amd_published.json` ids):", ""]
    tail += [f"- {arch} {label}: {source}" for (arch, label), source in srcs.items()]
    text = "\n".join(head + lines + tail) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as fh:
            fh.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
