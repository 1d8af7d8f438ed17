"""Packed (varlen) prefill against the dense kernel on padded batches, on one GPU.

A batch of prompts with mixed lengths is run three ways on the same tokens:

* ``rocmflash varlen`` -- ``rocmflash.flash_attn_varlen_func`` on the packed tokens (no padding);
  ``rocmflash varlen unchecked`` the same call with ``check_values=False`` (no host read of the
  cumulative lengths, so the call does not wait for the GPU);
* ``rocmflash varlen kernel`` (equal-length mixes only) -- the varlen kernel itself: the public call serves an
  equal-length batch by the dense path (``rocmflash.api.varlen._as_dense_batch``), so this row keeps what it ran
  before (``rocmflash.api.varlen.packed_varlen``, unchecked); ``rocmflash varlen, LSE`` and ``rocmflash varlen
  kernel, LSE`` the same two with ``return_lse=True`` (backward through the output and the LSE);
* ``rocmflash varlen, no grad`` (forward table only) -- the same public call under ``torch.no_grad()``: what an
  inference caller runs, served by torch's ``varlen_attn`` where the varlen entry says it won;
* ``rocmflash dense padded`` -- ``rocmflash.flash_attn_func`` on the batch right-padded to the
  longest prompt (what a model without a varlen path runs; the padding is computed and thrown away);
* ``sdpa padded`` -- PyTorch SDPA's default backend on the same right-padded batch with
  ``is_causal=True`` (right padding keeps every real query's causal row exact);
* ``sdpa jagged`` -- PyTorch SDPA on the packed tokens as jagged nested tensors
  (``torch.nested.nested_tensor_from_jagged`` views of q/k/v with the cumulative lengths, ``max_seqlen``
  given so nothing is read back), ``is_causal=True``, ``enable_gqa`` where the heads differ: the platform's
  own varlen attention, the incumbent a varlen entry would time. Where this torch refuses it, the error
  is listed below the table (and ``sdpa jagged, K/V heads repeated`` is tried: the same with K/V
  expanded to the query heads, one copy per call, counted);
* ``torch varlen_attn`` -- ``torch.nn.attention.varlen.varlen_attn`` on the packed tokens and the same
  ``cu_seqlens`` (the platform's varlen function that ``rocmflash tune --mode varlen`` times as the entry's
  incumbent, called as :mod:`rocmflash.api.varlen_incumbent` calls it: causal, GQA without copies); where this torch
  has none or refuses the inputs, the reason is listed below the table.

Forward and forward+backward, through the public APIs (host time included). TFLOP/s count only
useful work: 4·Hq·D·sum(Sq_b·Sk_b)/2 per causal forward, 3.5x that for forward+backward. Timing:
``n`` back-to-back calls between CUDA events after a warm-up, median over interleaved rounds.

Options for the varlen backward (``rocmflash tune --mode varlen --pass bwd``):

* ``--mixes tuned``: the packed batches of the live GPU's varlen forward entries in the databases
  run-time selection reads (the shipped one and yours), each exactly as tuned, instead of the bench's mixes;
* ``--bwd-default``: also time ``rocmflash varlen (bwd default)``, the same public call with the
  backward pinned to the per-arch default (what it ran before ``varlen-bwd-``/``bwd-`` entries were
  served), in the same interleaved rounds;
* ``--varlen-only``: skip the padded dense and SDPA paths.

Below the table, each mix's backward selection (source, entry, config) is listed.

Usage (on a GPU)::

    python benchmarks/varlen.py --out $OUT [--rounds 5] [--quick | --mha]
    python benchmarks/varlen.py --out $OUT --mixes tuned --bwd-default --varlen-only
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys

from interleaved import MarkdownTable, interleaved_medians

#: name -> (lengths, Hq, Hkv, D)
def _mixes(torch, quick: bool):
    gen = torch.Generator().manual_seed(0)
    mixes = {
        "16 prompts 256..4096 (~34k tok) Hq32 Hkv8 D128": (torch.randint(256, 4097, (16,), generator=gen).tolist(), 32, 8, 128),
        "64 prompts 64..1024 (~35k tok) Hq32 Hkv8 D128": (torch.randint(64, 1025, (64,), generator=gen).tolist(), 32, 8, 128),
        "8 prompts 4096 (equal) Hq32 Hkv8 D128": ([4096] * 8, 32, 8, 128),
        "4 docs 8k + 28 short 128..512, Hq16 Hkv16 D64": ([8192] * 4 + torch.randint(128, 513, (28,), generator=gen).tolist(), 16, 16, 64),
        "32 prompts 1024 (equal) Hq32 Hkv8 D128": ([1024] * 32, 32, 8, 128),
        "16 prompts 2048 (equal) Hq16 Hkv16 D64": ([2048] * 16, 16, 16, 64),
    }
    if quick == "mha":  # the mixes whose heads torch's varlen_attn takes on every torch (no GQA needed)
        return {"16 prompts 256..4096 (~34k tok) Hq16 Hkv16 D128":
                (torch.randint(256, 4097, (16,), generator=gen).tolist(), 16, 16, 128),
                **{name: mix for name, mix in mixes.items() if mix[1] == mix[2] and len(set(mix[0])) > 1}}
    if quick:
        return dict(list(mixes.items())[:2])
    return mixes


def _tuned_mixes(torch) -> dict:
    """The packed batch of every measured varlen forward entry of the live GPU's databases (as tuned)."""
    from rocmflash.hw.detect import detect_live_gpu
    from rocmflash.db import iter_database_entries, servable
    from rocmflash.tuning.varlen import VarlenProblem, parse_varlen_key

    gpu = detect_live_gpu()
    if gpu is None:
        raise SystemExit("--mixes tuned: the live GPU is not in the catalog")
    mixes = {}
    for _, _, key, entry in iter_database_entries(gpu.name):
        if parse_varlen_key(key) is None or not servable(entry) or key in mixes:
            continue
        p = VarlenProblem.from_dict(entry["problem"])
        if not p.causal or p.dtype != "bf16":
            continue  # the bench runs causal bf16
        name = (f"{key}: {len(p.lengths)} seqs {min(p.lengths)}..{p.max_seqlen} Hq{p.heads_q} Hkv{p.heads_kv} "
                f"D{p.head_dim}")
        mixes[key] = (name, (list(p.lengths), p.heads_q, p.heads_kv, p.head_dim))
    if not mixes:
        raise SystemExit(f"--mixes tuned: no measured causal bf16 varlen entry for {gpu.name}")
    return dict(mixes.values())


class _PinnedBackward:
    """Within ``with``: ``flash_attn_varlen_func``'s backward runs the per-arch default (selection bypassed)."""

    def __enter__(self):
        import rocmflash.api.selection as S
        from rocmflash.kernels.backward.host import default_bwd_config

        self.real = S.select_varlen_bwd_config

        def pinned(device, head_dim, *args, **kwargs):
            return default_bwd_config(S.device_identity(device)[1], head_dim)

        S.select_varlen_bwd_config = pinned
        return self

    def __exit__(self, *exc):
        import rocmflash.api.selection as S

        S.select_varlen_bwd_config = self.real


def _cases(torch, lengths, hq, hkv, d, dtype, varlen_only=False, bwd_default=False):
    import torch.nn.functional as F

    import rocmflash
    from rocmflash.api import varlen as varlen_api
    from rocmflash.api.varlen import packed_varlen
    from rocmflash.kernels import masks as M

    dev = "cuda"
    total, B, S = sum(lengths), len(lengths), max(lengths)
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device=dev)
    q = torch.randn(total, hq, d, device=dev, dtype=dtype, requires_grad=True)
    k = torch.randn(total, hkv, d, device=dev, dtype=dtype, requires_grad=True)
    v = torch.randn(total, hkv, d, device=dev, dtype=dtype, requires_grad=True)
    # the same tokens right-padded to (B, S, H, D)
    pad = [torch.zeros(B, S, h, d, device=dev, dtype=dtype) for h in (hq, hkv, hkv)]
    for b, (lo, n) in enumerate(zip(cu.tolist(), lengths)):
        for dst, src in zip(pad, (q, k, v)):
            dst[b, :n] = src.detach()[lo:lo + n]
    qp, kp, vp = (t.requires_grad_(True) for t in pad)
    go_packed, go_pad = torch.randn_like(q), torch.randn_like(qp)

    def varlen(bwd, check_values=True):
        out = rocmflash.flash_attn_varlen_func(q, k, v, cu, cu, S, S, causal=True, check_values=check_values)
        if bwd:
            out.backward(go_packed)

    def varlen_unchecked(bwd):
        varlen(bwd, check_values=False)

    def varlen_inference(bwd):  # forward only, no gradients: where the entry says so, torch's varlen_attn serves it
        with torch.no_grad():
            rocmflash.flash_attn_varlen_func(q, k, v, cu, cu, S, S, causal=True)

    def varlen_kernel(bwd):  # the varlen kernel whatever the lengths (no dense route for equal ones), unchecked
        out = packed_varlen(q, k, v, cu, cu, S, S, d ** -0.5, True, -1, 0.0)
        if bwd:
            out.backward(go_packed)

    go_lse = torch.randn(hq, total, device=dev)

    def varlen_lse(bwd):  # the public call returning the LSE (ring/context-parallel merges), unchecked
        out, lse = rocmflash.flash_attn_varlen_func(q, k, v, cu, cu, S, S, causal=True, return_lse=True)
        if bwd:
            torch.autograd.backward((out, lse), (go_packed, go_lse))

    def varlen_kernel_lse(bwd):  # the same on the varlen kernel (its validated call, as the API ran it before)
        out, lse = varlen_api._run(q, k, v, cu, cu, B, S, S, None, 0.0, (M.UNBOUNDED, 0), True, True, q.device)
        if bwd:
            torch.autograd.backward((out, lse), (go_packed, go_lse))

    def dense(bwd):
        out = rocmflash.flash_attn_func(qp, kp, vp, causal=True)
        if bwd:
            out.backward(go_pad)

    def sdpa(bwd):
        out = F.scaled_dot_product_attention(qp.transpose(1, 2), kp.transpose(1, 2), vp.transpose(1, 2),
                                             is_causal=True, enable_gqa=hq != hkv)
        if bwd:
            out.backward(go_pad.transpose(1, 2))

    def varlen_bwd_default(bwd):
        with _PinnedBackward():
            varlen(bwd)

    offsets = cu.to(torch.int64)

    def jagged(x):  # (B, H, j, D) view of packed (total, H, D) tokens
        return torch.nested.nested_tensor_from_jagged(x, offsets, min_seqlen=min(lengths),
                                                      max_seqlen=S).transpose(1, 2)

    def sdpa_jagged(bwd, repeat=False):
        kk, vv = (t.repeat_interleave(hq // hkv, dim=1) for t in (k, v)) if repeat else (k, v)
        out = F.scaled_dot_product_attention(jagged(q), jagged(kk), jagged(vv), is_causal=True,
                                             enable_gqa=hq != hkv and not repeat).transpose(1, 2).values()
        if bwd:
            out.backward(go_packed)
        return out

    def torch_varlen(bwd):
        from rocmflash.api import varlen_incumbent as VI

        why = VI.excludes(True, True, hq // hkv, d, None)
        if why is not None:
            raise RuntimeError(why)
        out = VI.run(q, k, v, cu, cu, S, S, True, None)
        if bwd:
            out.backward(go_packed)
        return out

    cases = {"rocmflash varlen": varlen, "rocmflash varlen unchecked": varlen_unchecked,
             INFERENCE: varlen_inference}
    if len(set(lengths)) == 1:  # equal lengths: the public call runs the dense path; the varlen kernel beside it
        cases["rocmflash varlen kernel"] = varlen_kernel
        cases["rocmflash varlen, LSE"] = varlen_lse
        cases["rocmflash varlen kernel, LSE"] = varlen_kernel_lse
    if bwd_default:
        cases["rocmflash varlen (bwd default)"] = varlen_bwd_default
    if not varlen_only:
        cases.update({"rocmflash dense padded": dense, "sdpa padded": sdpa})
        for name, fn in (("sdpa jagged", sdpa_jagged),
                         ("sdpa jagged, K/V heads repeated", lambda bwd: sdpa_jagged(bwd, repeat=True)),
                         ("torch varlen_attn", torch_varlen)):
            if name.endswith("repeated") and (hq == hkv or "sdpa jagged" in cases):
                continue
            for bwd in (True, False):  # with its backward, else (where torch has none for it) forward only
                try:  # the platform's varlen path, where this torch has one for these inputs
                    got = fn(bwd).detach().float()
                    want = rocmflash.flash_attn_varlen_func(q, k, v, cu, cu, S, S, causal=True).detach().float()
                    CHECKED.append(f"{name} ({len(lengths)} seqs, Hq{hq} Hkv{hkv} D{d}"
                                   f"{'' if bwd else ', forward only'}): relative L2 difference to rocmflash varlen "
                                   f"{float((got - want).norm() / want.norm()):.2e}")
                    cases[name] = fn
                    if not bwd:
                        FORWARD_ONLY.add(name)
                    break
                except Exception as err:  # noqa: BLE001 - recorded under the table: torch refused these inputs
                    REFUSED.append(f"{name} ({len(lengths)} seqs, Hq{hq} Hkv{hkv} D{d}"
                                   f"{', with backward' if bwd else ''}): {type(err).__name__}: "
                                   f"{str(err).splitlines()[0][:160]}")
        for t in (q, k, v):
            t.grad = None
    return cases


#: the forward-only public call (no gradients); timed in the forward table only
INFERENCE = "rocmflash varlen, no grad"
FORWARD_ONLY: set = {INFERENCE}  #: paths timed in the forward table only (a platform path without a backward)
REFUSED: list = []  #: the SDPA jagged paths this torch refused, and why
CHECKED: list = []  #: the SDPA jagged paths this torch ran, and how far their output is from rocmflash's


def _backward_served(torch, lengths, hq, hkv, d) -> str:
    """The varlen backward's selection for this mix (run one backward first)."""
    from rocmflash.api import selection

    device = torch.device("cuda", torch.cuda.current_device())
    details = selection.varlen_bwd_selection_details(device, d, torch.bfloat16, True, hq // hkv, max(lengths))
    if details is None:
        return "not selected"
    cfg = details["config"]
    tiles = (f"dQ {cfg.dq.BLOCK_M}x{cfg.dq.BLOCK_N} w{cfg.dq.num_warps} s{cfg.dq.num_stages}, dK/dV "
             f"{cfg.dkdv.BLOCK_M}x{cfg.dkdv.BLOCK_N} w{cfg.dkdv.num_warps} s{cfg.dkdv.num_stages}")
    replaced = f"; replaced by the default: {details['replaced']}" if details["replaced"] else ""
    return f"{details['source']} {details['entry'] or ''} ({tiles}){replaced}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=".", help="directory for varlen.md (written after every row)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=10, help="calls per timed round")
    ap.add_argument("--quick", action="store_true", help="two mixes only")
    ap.add_argument("--mha", action="store_true",
                    help="the mixes without GQA only (torch's varlen_attn takes GQA only from some torch on)")
    ap.add_argument("--mixes", choices=("bench", "tuned"), default="bench",
                    help="bench: the four mixes below (default); tuned: the packed batches of the live GPU's "
                         "measured varlen forward entries")
    ap.add_argument("--bwd-default", action="store_true",
                    help="also time the varlen path with its backward pinned to the per-arch default")
    ap.add_argument("--varlen-only", action="store_true", help="skip the padded dense and SDPA paths")
    args = ap.parse_args(argv)
    import torch
    import triton

    if not torch.cuda.is_available():
        print("benchmarks/varlen.py needs a GPU", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "varlen.md")
    head = [f"# varlen prefill: packed vs padded ({datetime.date.today()})", "",
            f"- device: {torch.cuda.get_device_name()}; torch {torch.__version__}; triton {triton.__version__}",
            f"- command: `python {' '.join(sys.argv)}`", "- causal, bf16; µs per call (median of rounds), "
            "useful TFLOP/s (padding not counted); ratio = time / rocmflash varlen", "",
            "| mix | pass | path | µs | TFLOP/s | time vs varlen |", "|---|---|---|---|---|---|"]
    table = MarkdownTable(path, head)
    mixes = _tuned_mixes(torch) if args.mixes == "tuned" else _mixes(torch, "mha" if args.mha else args.quick)
    for name, (lengths, hq, hkv, d) in mixes.items():
        useful = 4.0 * hq * d * sum(n * n for n in lengths) / 2
        cases = _cases(torch, lengths, hq, hkv, d, torch.bfloat16, args.varlen_only, args.bwd_default)
        for bwd in (False, True):
            med = interleaved_medians(torch, {p: (lambda fn=fn: fn(bwd)) for p, fn in cases.items()
                                              if not (bwd and p in FORWARD_ONLY)}, args.rounds, args.iters)
            for p, t in med.items():
                flops = useful * (3.5 if bwd else 1.0)
                table.add(f"| {name} | {'fwd+bwd' if bwd else 'fwd'} | {p} | {t:.0f} | {flops / t / 1e6:.0f} | "
                          f"{t / med['rocmflash varlen']:.2f}x |")
            table.flush()
        line = f"- {name}: varlen backward served {_backward_served(torch, lengths, hq, hkv, d)}"
        print(line, flush=True)
        table.tail.append(line)
        table.tail += [f"- refused: {r}" for r in REFUSED] + [f"- checked: {c}" for c in CHECKED]
        REFUSED.clear()
        CHECKED.clear()
        FORWARD_ONLY.intersection_update({INFERENCE})
        table.flush()
        del cases
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
