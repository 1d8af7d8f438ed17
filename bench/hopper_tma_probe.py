"""Diagnostic: how much a Hopper tensor-descriptor (TMA) forward could gain over ``online``.

Issue 10 asks for the forward toward cuDNN and allows a Hopper-only path picked by the
tuner. Before building one into the package, this measures the potential: a minimal
online-softmax forward whose Q/K/V/O tiles move through host-built tensor descriptors
(``triton.tools.tensor_descriptor.TensorDescriptor``, public since Triton 3.3), optionally
with Triton's warp-specialised loop (``tl.range(..., warp_specialize=True)``), swept over
a few tiles, against ``rocmflash.attention`` (shipped configs) and SDPA's cuDNN and flash
backends on the same inputs. Kernel-level timing (``triton.testing.do_bench``), so it is
a diagnostic, not a user-facing figure.

    python bench/hopper_tma_probe.py --out $OUT
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from rocmflash.kernels import common as C

LOG2E = 1.4426950408889634


@triton.jit
def _tma_block(acc, m_i, l_i, q, desc_k, desc_v, off_z, off_hk, start_n, offs_m, qk_scale, SEQ_Q, SEQ_K,
               HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, MASK: tl.constexpr,
               DIAG: tl.constexpr = 0):
    # DIAG (diagnostics only, wrong results): 1 no exp2, 2 no rescale of acc, 3 no softmax (GEMMs only)
    k = desc_k.load([off_z, off_hk, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
    s = tl.dot(q, k.T)
    v = desc_v.load([off_z, off_hk, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
    if DIAG == 3:
        return tl.dot(s.to(v.dtype), v, acc), m_i, l_i
    if MASK:
        s = C.mask_scores(s, offs_m, start_n + tl.arange(0, BLOCK_N), SEQ_Q, SEQ_K, CAUSAL)
    m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
    if MASK:
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_use = m_new
    if DIAG == 1:
        p = s * qk_scale - m_use[:, None]
    else:
        p = tl.math.exp2(s * qk_scale - m_use[:, None])
    alpha = tl.math.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, 1)
    if DIAG == 2:
        acc = tl.dot(p.to(v.dtype), v, acc)
    else:
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return acc, m_new, l_i


@triton.jit
def _fwd_tma(desc_q, desc_k, desc_v, desc_o, LSE, qk_scale, H_Q, GROUP, SEQ_Q, SEQ_K,
             HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             CAUSAL: tl.constexpr, WARP_SPEC: tl.constexpr, DIAG: tl.constexpr):
    start_m = C.query_block(CAUSAL) * BLOCK_M
    off_bh = tl.program_id(1)
    off_z = off_bh // H_Q
    off_h = off_bh % H_Q
    off_hk = off_h // GROUP
    offs_m = start_m + tl.arange(0, BLOCK_M)
    q = desc_q.load([off_z, off_h, start_m, 0]).reshape(BLOCK_M, HEAD_DIM)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    full_end, hi = C.kv_bounds(start_m, SEQ_Q, SEQ_K, BLOCK_M, BLOCK_N, CAUSAL)
    for start_n in tl.range(0, full_end, BLOCK_N, warp_specialize=WARP_SPEC):
        acc, m_i, l_i = _tma_block(acc, m_i, l_i, q, desc_k, desc_v, off_z, off_hk, start_n, offs_m, qk_scale,
                                   SEQ_Q, SEQ_K, HEAD_DIM, BLOCK_N, CAUSAL, False, DIAG)
    for start_n in range(full_end, hi, BLOCK_N):
        acc, m_i, l_i = _tma_block(acc, m_i, l_i, q, desc_k, desc_v, off_z, off_hk, start_n, offs_m, qk_scale,
                                   SEQ_Q, SEQ_K, HEAD_DIM, BLOCK_N, CAUSAL, True)
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    o = acc / l_safe[:, None]
    desc_o.store([off_z, off_h, start_m, 0], o.to(desc_o.dtype).reshape(1, 1, BLOCK_M, HEAD_DIM))
    lse = (m_i + tl.math.log2(l_safe)) * 0.6931471805599453
    tl.store(LSE + off_bh.to(tl.int64) * SEQ_Q + offs_m, lse, mask=offs_m < SEQ_Q)


def _desc(t, rows):
    B, H, S, D = t.shape
    return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, rows, D])


def tma_forward(q, k, v, causal, cfg, out=None, lse=None, diag=0):
    """Run the probe kernel on contiguous ``(B, H, S, D)`` tensors; returns ``out``."""
    BM, BN, warps, stages, ws = cfg
    B, Hq, Sq, D = q.shape
    out = torch.empty_like(q) if out is None else out
    lse = torch.empty((B, Hq, Sq), device=q.device, dtype=torch.float32) if lse is None else lse
    grid = (triton.cdiv(Sq, BM), B * Hq)
    _fwd_tma[grid](_desc(q, BM), _desc(k, BN), _desc(v, BN), _desc(out, BM), lse, D ** -0.5 * LOG2E,
                   Hq, Hq // k.shape[1], Sq, k.shape[2], HEAD_DIM=D, BLOCK_M=BM, BLOCK_N=BN, CAUSAL=causal,
                   WARP_SPEC=ws, DIAG=diag, num_warps=warps, num_stages=stages)
    return out


#: name -> (B, Hq, Hkv, S, D, causal)
SHAPES = {
    "D128 S2048 B8 H16": (8, 16, 16, 2048, 128, False),
    "D128 S2048 B8 H16 causal": (8, 16, 16, 2048, 128, True),
    "D128 S8192 B2 H16": (2, 16, 16, 8192, 128, False),
    "D128 S8192 B2 H16 causal": (2, 16, 16, 8192, 128, True),
    "D64 S2048 B8 H32": (8, 32, 32, 2048, 64, False),
    "D128 Hq32 Hkv8 S4096 B2 causal": (2, 32, 8, 4096, 128, True),
}
CONFIGS = [(128, bn, w, s, ws) for (bn, w, s) in ((64, 4, 3), (64, 4, 4), (128, 8, 2), (128, 8, 3), (64, 8, 3),
                                                   (128, 4, 2)) for ws in (False, True)]


def _flops(B, Hq, S, D, causal):
    return 4.0 * B * Hq * S * S * D * (0.5 if causal else 1.0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--limits", action="store_true",
                    help="time the probe kernel with parts of the softmax removed (wrong results; a cost breakdown)")
    args = ap.parse_args(argv)
    if args.limits:
        return limits(args.out)
    import rocmflash
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    os.makedirs(args.out, exist_ok=True)
    rows, best = [], {}
    shapes = dict(list(SHAPES.items())[:1]) if args.quick else SHAPES
    for name, (B, Hq, Hkv, S, D, causal) in shapes.items():
        torch.manual_seed(0)
        q = torch.randn(B, Hq, S, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16)
        ke, ve = k.repeat_interleave(Hq // Hkv, 1), v.repeat_interleave(Hq // Hkv, 1)
        ref = torch.nn.functional.scaled_dot_product_attention(q.float(), ke.float(), ve.float(), is_causal=causal)
        fl = _flops(B, Hq, S, D, causal)

        def tf(ms):
            return fl / (ms * 1e-3) / 1e12

        ms = do_bench(lambda: rocmflash.attention(q, k, v, causal=causal), warmup=50, rep=300)
        rows.append((name, "rocmflash.attention", tf(ms), ""))
        for label, be in (("sdpa cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa flash", SDPBackend.FLASH_ATTENTION)):
            try:
                with sdpa_kernel([be]):
                    ms = do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(
                        q, ke, ve, is_causal=causal), warmup=50, rep=300)
                rows.append((name, label, tf(ms), ""))
            except RuntimeError as e:
                rows.append((name, label, float("nan"), str(e).splitlines()[0][:80]))
        out = torch.empty_like(q)
        for cfg in (CONFIGS[:2] if args.quick else CONFIGS):
            label = "tma BM%d BN%d w%d s%d%s" % (*cfg[:4], " ws" if cfg[4] else "")
            try:
                out.fill_(float("nan"))
                tma_forward(q, k, v, causal, cfg, out)
                torch.cuda.synchronize()
                err = ((out.float() - ref).norm() / ref.norm()).item()
                if not err < 2e-2:
                    rows.append((name, label, float("nan"), f"rel err {err:.3g}"))
                    continue
                ms = do_bench(lambda: tma_forward(q, k, v, causal, cfg, out), warmup=50, rep=300)
                rows.append((name, label, tf(ms), f"rel err {err:.2e}"))
            except Exception as e:  # a config that does not compile or fit is a row, not a stop
                rows.append((name, label, float("nan"), f"{type(e).__name__}: {str(e).splitlines()[0][:90]}"))
            print(rows[-1], flush=True)
    lines = ["| shape | path | TFLOP/s | note |", "|---|---|---|---|"]
    lines += [f"| {n} | {p} | {t:.0f} | {note} |" for n, p, t, note in rows]
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(args.out, "hopper-tma-probe.md"), "w") as f:
        f.write(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}\n\n{text}\n")
    with open(os.path.join(args.out, "hopper-tma-probe.json"), "w") as f:
        json.dump(rows, f)
    return 0


LIMIT_CASES = {  # shape -> configs (the probe's best per shape)
    "D128 S8192 B2 H16": [(128, 128, 8, 3, False), (128, 64, 4, 3, False)],
    "D128 S2048 B8 H16": [(128, 128, 8, 3, False)],
    "D64 S2048 B8 H32": [(128, 64, 4, 3, False), (128, 128, 4, 2, False)],
}
DIAGS = {0: "full kernel", 1: "no exp2", 2: "no acc rescale", 3: "GEMMs only (no softmax)"}


def limits(out_dir: str) -> int:
    """Which part of the loop bounds the forward: the same kernel with parts removed."""
    from triton.testing import do_bench

    os.makedirs(out_dir, exist_ok=True)
    lines = ["| shape | config | variant | TFLOP/s | vs full |", "|---|---|---|---|---|"]
    for name, cfgs in LIMIT_CASES.items():
        B, Hq, Hkv, S, D, causal = SHAPES[name]
        q, k, v = (torch.randn(B, h, S, D, device="cuda", dtype=torch.bfloat16) for h in (Hq, Hkv, Hkv))
        out = torch.empty_like(q)
        fl = _flops(B, Hq, S, D, causal)
        for cfg in cfgs:
            full = None
            for diag, label in DIAGS.items():
                ms = do_bench(lambda: tma_forward(q, k, v, causal, cfg, out, diag=diag), warmup=50, rep=300)
                tf = fl / (ms * 1e-3) / 1e12
                full = full or tf
                lines.append(f"| {name} | BM{cfg[0]} BN{cfg[1]} w{cfg[2]} s{cfg[3]} | {label} | {tf:.0f} | "
                             f"{tf / full:.2f}x |")
                print(lines[-1], flush=True)
    with open(os.path.join(out_dir, "hopper-limits.md"), "w") as f:
        f.write(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}\n\n")
        f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
