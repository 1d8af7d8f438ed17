"""The decode split kernel with its cache-length arguments unspecialised, against Triton's specialised build.

``kv_decode_jit.LENGTH_ARGS`` (the cache's length and the K/V strides that follow it) are left
unspecialised so that one binary, and one launch plan, serve every length of a cache that grows by
one key each call (transformers' generate). ``KV_ALIGNED`` gives the strides back the divisibility
that Triton's specialisation gave them. This script cross-compiles both builds of the per-arch
default (D=128, bf16, GQA 8, contiguous and paged) and prints, per target, what the compiler made:
VGPRs/AGPRs, spills, scratch, LDS and waves per SIMD (AMD, read with ``isa_tools``), and each
load/store/LDS/MFMA instruction's count (AMD) or global load/store/async-copy/MMA count (NVIDIA PTX).
A third column builds the unspecialised kernel without ``KV_ALIGNED``: what the hint is worth.

No GPU needed::

    python benchmarks/decode_length_args.py [--out DIR]
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys


def instruction_counts(asm: str, nvidia: bool) -> dict:
    """Each load, store, LDS and matrix instruction's count in AMD assembly, or (``nvidia``) each global load/store,
    async copy (with its byte count) and MMA's in PTX; the real-compiler tests assert with it too."""
    if nvidia:
        pattern = r"^\s*(?:@%p\d+\s+)?((?:ld|st|cp\.async|mma|wgmma)[\w.]*)(?:\s.*?,\s*(0x[0-9a-f]+))?"
        found = collections.Counter(m.group(1) + (f" {m.group(2)}" if m.group(2) else "")
                                    for m in re.finditer(pattern, asm, re.M))
        return {k: v for k, v in found.items() if not k.startswith(("ld.param", "ld.shared", "st.shared"))}
    found = collections.Counter(m.group(1) for m in re.finditer(
        r"^\s*((?:buffer|global|flat|ds|scratch)_\w+|v_mfma\w*)\b", asm, re.M))
    return dict(found)


def _registers(kernel) -> dict:
    from isa_tools import kernel_summary, read_code_object

    (res,) = read_code_object(kernel.asm["hsaco"])
    s = kernel_summary(res, num_warps=kernel.metadata.num_warps, asm=kernel.asm["amdgcn"])
    return {k: s[k] for k in ("vgpr_count", "agpr_count", "vgpr_spill_count", "scratch_bytes", "lds_bytes",
                              "waves_per_simd")}


def builds(target: str, paged: bool) -> dict:
    """``{build name: (registers or {}, ops)}`` of the three builds of the split kernel for ``target``."""
    from rocmflash.kernels import common as C
    from rocmflash.kernels.decode import host as KD

    cfg = KD.default_decode_config(target, 128)
    nvidia = target.startswith("sm_")
    unspecialised_fn, aligned = KD._decode_split, KD.strides_aligned
    out = {}
    for name, fn, rule in (("specialised (before)", C._DualJIT(unspecialised_fn.fn), lambda lengths: False),
                           ("unspecialised + KV_ALIGNED", unspecialised_fn, aligned),
                           ("unspecialised, no hint", unspecialised_fn, lambda lengths: False)):
        KD._decode_split, KD.strides_aligned = fn, rule
        try:
            kernel = KD.compile_for(target, cfg, 128, "bf16", group=8, paged=paged, page_size=256)[0]
        finally:
            KD._decode_split, KD.strides_aligned = unspecialised_fn, aligned
        asm = kernel.asm["ptx"] if nvidia else kernel.asm["amdgcn"]
        out[name] = ({} if nvidia else _registers(kernel), instruction_counts(asm, nvidia))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--targets", default="gfx90a,gfx942,gfx950,sm_90")
    ap.add_argument("--out", default=None, help="also write the table to DIR/decode-length-args.md")
    args = ap.parse_args(argv)
    import triton

    lines = [f"Triton {triton.__version__}; split kernel of the per-arch decode default, D=128, bf16, GQA 8", ""]
    for target in args.targets.split(","):
        for paged in (False, True):
            found = builds(target.strip(), paged)
            lines.append(f"## {target} {'paged (page 256)' if paged else 'contiguous'}")
            lines.append("")
            lines.append("| build | registers | loads / stores / LDS / matrix ops |")
            lines.append("|---|---|---|")
            for name, (regs, ops) in found.items():
                reg_text = ", ".join(f"{k} {v}" for k, v in regs.items()) or "(PTX: see the ops)"
                op_text = ", ".join(f"{k} {v}" for k, v in sorted(ops.items()))
                lines.append(f"| {name} | {reg_text} | {op_text} |")
            lines.append("")
    text = "\n".join(lines)
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "decode-length-args.md"), "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
