"""fp64 references in plain torch (packed varlen attention with bands and soft-capping; one-batch (B, H, S, D)
attention and its fp16 inputs), and a database writer for the varlen tests."""

import math

import torch


def band_mask(seqlen_q: int, seqlen_k: int, causal: bool, window: tuple) -> torch.Tensor:
    """``[Sq, Sk]`` bool: query i sees key j (bottom-right aligned, flash-attn's window rule)."""
    left, right = window
    if causal:
        right = 0
    i = torch.arange(seqlen_q)[:, None]
    j = torch.arange(seqlen_k)[None, :]
    shift = seqlen_k - seqlen_q
    keep = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool)
    if left >= 0:
        keep &= j >= i + shift - left
    if right >= 0:
        keep &= j <= i + shift + right
    return keep


def attention_fp64(q, k, v, scale: float, causal: bool = False, window: tuple = (-1, -1), softcap: float = 0.0):
    """One sequence: q ``(Sq, Hq, D)``, k/v ``(Sk, Hkv, D)`` -> out ``(Sq, Hq, D)``, lse ``(Hq, Sq)`` (fp64)."""
    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, 1)
    v = v.repeat_interleave(group, 1)
    s = torch.einsum("qhd,khd->hqk", q, k) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(~band_mask(q.shape[0], k.shape[0], causal, window), float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.nan_to_num(torch.exp(s - lse[..., None]), nan=0.0)  # rows that see nothing: 0
    return torch.einsum("hqk,khd->qhd", p, v), lse


def varlen_fp64(q, k, v, cu_q, cu_k, scale, causal=False, window=(-1, -1), softcap=0.0):
    """Packed reference: ``(total_q, Hq, D)`` output and ``(Hq, total_q)`` LSE."""
    cu_q, cu_k = [int(x) for x in cu_q], [int(x) for x in cu_k]
    outs, lses = [], []
    for b in range(len(cu_q) - 1):
        o, lse = attention_fp64(q[cu_q[b]:cu_q[b + 1]], k[cu_k[b]:cu_k[b + 1]], v[cu_k[b]:cu_k[b + 1]],
                                scale, causal, window, softcap)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses, 1)


def bhsd_inputs(Sq=64, Sk=64, Hq=4, Hkv=2, D=32, seed=0, grad=False) -> list:
    """Fresh fp16 ``q (1, Hq, Sq, D)``, ``k``/``v (1, Hkv, Sk, D)`` on the CPU (``grad``: leaves needing gradients)."""
    g = torch.Generator().manual_seed(seed)
    ts = [torch.randn(1, h, s, D, generator=g).half() for h, s in ((Hq, Sq), (Hkv, Sk), (Hkv, Sk))]
    return [t.requires_grad_(grad) for t in ts]


def bhsd_fp64(q, k, v, causal=False):
    """fp64 attention of one-batch ``(1, H, S, D)`` tensors (:func:`attention_fp64`, scale ``1/sqrt(D)``)."""
    o, _ = attention_fp64(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1),
                          1 / math.sqrt(q.shape[-1]), causal)
    return o.transpose(0, 1)[None]


def rel_err(a, b) -> float:
    """max |a - b| / max |b| (0 when both are all zero)."""
    a, b = a.double(), b.double()
    scale = b.abs().max().item()
    return (a - b).abs().max().item() / scale if scale > 0 else (a - b).abs().max().item()


def write_mi250_db(tmp_path, entries: dict) -> None:
    """A user database for the (fake) MI250 holding ``entries``, in ``tmp_path``; every run-time cache forgotten."""
    from rocmflash import db as D
    from rocmflash.api import selection

    data = D.ConfigDB.new_data("mi250", "gfx90a", {})
    data["entries"] = entries
    D.atomic_write_json(str(tmp_path / "mi250.json"), data)
    D.clear_cache()
    selection.clear_cache()
