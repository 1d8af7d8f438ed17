"""``flash_attn_varlen_func`` against an fp64 reference, in Triton's interpreter (CPU).

Packed batches with lengths 0, 1, 17, 97 and 1025, GQA 1/4/8, causal both, sliding
windows, soft-capping, fp16/bf16 and head dims from 16 to 256 (padded ones included):
output, LSE and the gradients of q, k and v (also through the LSE). Buffers the kernels
fill are poisoned with NaN first, so a row the kernels forget to write shows up.
"""

import math

import pytest
import torch

from varlen_reference import rel_err, varlen_fp64

TOL = {torch.float16: 1e-2, torch.bfloat16: 2.5e-2}


def packed(lens_q, lens_k, heads_q, heads_kv, head_dim, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    cu_q = torch.tensor([0] + torch.tensor(lens_q).cumsum(0).tolist(), dtype=torch.int32)
    cu_k = torch.tensor([0] + torch.tensor(lens_k).cumsum(0).tolist(), dtype=torch.int32)
    q = torch.randn(int(cu_q[-1]), heads_q, head_dim, generator=gen).to(dtype)
    k = torch.randn(int(cu_k[-1]), heads_kv, head_dim, generator=gen).to(dtype)
    v = torch.randn(int(cu_k[-1]), heads_kv, head_dim, generator=gen).to(dtype)
    return q, k, v, cu_q, cu_k


def run_and_check(lens_q, lens_k, group, head_dim, dtype, causal, window, softcap, seed, grads=True,
                  heads_kv=2, lse_grad=False):
    from rocmflash import flash_attn_varlen_func

    q, k, v, cu_q, cu_k = packed(lens_q, lens_k, heads_kv * group, heads_kv, head_dim, dtype, seed)
    for t in (q, k, v):
        t.requires_grad_(grads)
    out, lse = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal,
                                      window_size=window, softcap=softcap, return_lse=True)
    qd, kd, vd = (t.detach().double().requires_grad_(grads) for t in (q, k, v))
    ref_out, ref_lse = varlen_fp64(qd, kd, vd, cu_q, cu_k, 1 / math.sqrt(head_dim), causal, window, softcap)
    tol = TOL[dtype]
    assert out.shape == q.shape and out.dtype == dtype and lse.shape == (q.shape[1], q.shape[0])
    assert torch.isfinite(out).all()
    assert rel_err(out, ref_out) < tol
    seen = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), seen)  # rows that see no key: LSE -inf, output 0
    assert (lse[seen].double() - ref_lse[seen]).abs().max().item() < 1e-3 if seen.any() else True
    if not grads:
        return
    gen = torch.Generator().manual_seed(seed + 1)
    dout = torch.randn(out.shape, generator=gen).to(dtype)
    dlse = torch.randn(lse.shape, generator=gen) if lse_grad else None
    loss = (out.float() * dout.float()).sum() + ((lse.masked_fill(~seen, 0) * dlse).sum() if lse_grad else 0)
    loss.backward()
    ref_loss = (ref_out * dout.double()).sum()
    if lse_grad:
        ref_loss = ref_loss + (ref_lse.masked_fill(~seen, 0) * dlse.double()).sum()
    ref_loss.backward()
    for name, got, want in (("dq", q.grad, qd.grad), ("dk", k.grad, kd.grad), ("dv", v.grad, vd.grad)):
        assert torch.isfinite(got).all(), name
        assert rel_err(got, want) < 2 * tol, (name, rel_err(got, want))


@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_mixed_lengths(interpret, poisoned, group, causal):
    run_and_check([0, 1, 17, 97, 30], [5, 1, 17, 97, 64], group, 64, torch.bfloat16, causal, (-1, -1), 0.0,
                  seed=10 * group + causal, heads_kv=1)


@pytest.mark.parametrize("window,causal", [((16, -1), True), ((8, 8), False), ((0, 0), False), ((32, 4), False)])
def test_varlen_sliding_window(interpret, poisoned, window, causal):
    run_and_check([17, 97, 40], [17, 97, 70], 2, 32, torch.float16, causal, window, 0.0, seed=sum(window) + 7)


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_softcap(interpret, poisoned, causal):
    # a small cap so tanh saturates: the cap's gradient factor (1 - tanh^2) is far from 1
    run_and_check([33, 64], [33, 80], 1, 64, torch.bfloat16, causal, (-1, -1), 5.0, seed=3, lse_grad=True)


@pytest.mark.parametrize("head_dim", [16, 80, 128, 256])
def test_varlen_head_dims(interpret, poisoned, head_dim):
    run_and_check([20, 45], [31, 45], 2, head_dim, torch.float16, True, (-1, -1), 0.0, seed=head_dim,
                  heads_kv=1)


def test_varlen_long_sequence(interpret, poisoned):
    """A 1025-token sequence next to short ones (tails of every block size)."""
    run_and_check([1025, 1, 0], [1025, 3, 2], 1, 16, torch.bfloat16, True, (-1, -1), 0.0, seed=5, heads_kv=1)


def test_varlen_more_queries_than_keys(interpret, poisoned):
    """Causal with Sq > Sk: the first Sq - Sk queries see nothing (zeros, LSE -inf, zero gradients)."""
    run_and_check([40, 9], [25, 0], 1, 32, torch.bfloat16, True, (-1, -1), 0.0, seed=11, lse_grad=True)


def test_varlen_lse_gradient(interpret, poisoned):
    run_and_check([23, 50], [23, 64], 4, 32, torch.float16, False, (-1, -1), 0.0, seed=13, heads_kv=1,
                  lse_grad=True)


def test_varlen_matches_dense_kernel(interpret):
    """Equal lengths: the packed path agrees with the dense ``flash_attn_func`` on the same tokens."""
    from rocmflash import flash_attn_func, flash_attn_varlen_func

    B, S, H, D = 3, 40, 2, 64
    gen = torch.Generator().manual_seed(21)
    q, k, v = (torch.randn(B, S, H, D, generator=gen).to(torch.bfloat16) for _ in range(3))
    cu = torch.arange(0, (B + 1) * S, S, dtype=torch.int32)
    dense = flash_attn_func(q, k, v, causal=True)
    var = flash_attn_varlen_func(q.reshape(B * S, H, D), k.reshape(B * S, H, D), v.reshape(B * S, H, D),
                                 cu, cu, S, S, causal=True)
    assert rel_err(var.reshape(B, S, H, D), dense) < 2e-2


def test_varlen_unchecked_values_same_answer_no_host_read(interpret, poisoned, monkeypatch):
    """``check_values=False`` reads no cumulative-length values on the host and computes the same
    output and gradients; a non-bool is a TypeError; checked calls still refuse bad values."""
    from rocmflash import flash_attn_varlen_func

    lens = [17, 0, 45]
    q, k, v, cu_q, cu_k = packed(lens, lens, 4, 2, 32, torch.bfloat16, seed=8)
    results = []
    for check in (True, False):
        reads = []
        real = torch.Tensor.tolist
        monkeypatch.setattr(torch.Tensor, "tolist", lambda t: reads.append(t.shape) or real(t))
        qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
        out = flash_attn_varlen_func(qg, kg, vg, cu_q, cu_k, 45, 45, causal=True, check_values=check)
        monkeypatch.setattr(torch.Tensor, "tolist", real)
        assert len(reads) == (2 if check else 0), reads
        out.float().square().sum().backward()
        results.append((out, qg.grad, kg.grad, vg.grad))
    for got, want in zip(results[1], results[0]):
        assert torch.equal(got, want)
    with pytest.raises(TypeError, match="check_values"):
        flash_attn_varlen_func(q, k, v, cu_q, cu_k, 45, 45, check_values=1)
    bad = cu_q.clone()
    bad[1] = 50
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        flash_attn_varlen_func(q, k, v, bad, cu_k, 45, 45)


def test_varlen_all_empty(interpret):
    from rocmflash import flash_attn_varlen_func

    q, k, v, cu_q, cu_k = packed([0, 0], [0, 4], 2, 2, 32, torch.float16, seed=1)
    q.requires_grad_(True)
    out, lse = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 0, 4, return_lse=True)
    assert out.shape == (0, 2, 32) and lse.shape == (2, 0)
    out.sum().backward()
    assert q.grad.shape == q.shape


# ----------------------------------------------------------------------------- bad input
def _good():
    q, k, v, cu_q, cu_k = packed([5, 7], [5, 9], 4, 2, 32, torch.float16, seed=2)
    return dict(q=q, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=7, max_seqlen_k=9)


@pytest.mark.parametrize("change,exc,words", [
    (dict(cu_seqlens_q=torch.tensor([0, 7, 5], dtype=torch.int32)), ValueError, "cu_seqlens_q"),
    (dict(cu_seqlens_q=torch.tensor([0, 5, 11], dtype=torch.int32)), ValueError, "cu_seqlens_q[-1]"),
    (dict(cu_seqlens_k=torch.tensor([0, 14], dtype=torch.int32)), ValueError, "cu_seqlens_k"),
    (dict(cu_seqlens_k=torch.tensor([1, 5, 14], dtype=torch.int32)), ValueError, "start at 0"),
    (dict(cu_seqlens_q=torch.tensor([0, 5, 12])), TypeError, "int32"),
    (dict(cu_seqlens_q=torch.tensor([[0, 5, 12]], dtype=torch.int32)), ValueError, "1-D"),
    (dict(max_seqlen_q=6), ValueError, "max_seqlen_q"),
    (dict(max_seqlen_k=-1), ValueError, "max_seqlen_k"),
    (dict(window_size=(-2, 0)), ValueError, "window_size"),
    (dict(window_size=(4,)), ValueError, "window_size"),
    (dict(softcap=-1.0), ValueError, "softcap"),
    (dict(softcap=float("inf")), ValueError, "softcap"),
    (dict(softmax_scale=float("nan")), ValueError, "softmax_scale"),
    (dict(dropout_p=0.1), NotImplementedError, "dropout"),
    (dict(causal=1), TypeError, "causal"),
])
def test_varlen_bad_input(interpret, change, exc, words):
    from rocmflash import flash_attn_varlen_func

    args = _good()
    args.update(change)
    with pytest.raises(exc, match=None) as info:
        flash_attn_varlen_func(**args)
    assert words in str(info.value)


@pytest.mark.parametrize("which,shape,words", [
    ("q", (12, 4, 32, 1), "3-D"),
    ("k", (14, 3, 32), "k and v"),
    ("v", (14, 2, 16), "same shape"),
])
def test_varlen_bad_shapes(interpret, which, shape, words):
    from rocmflash import flash_attn_varlen_func

    args = _good()
    args[which] = torch.randn(*shape).to(torch.float16)
    with pytest.raises(ValueError) as info:
        flash_attn_varlen_func(**args)
    assert words in str(info.value)


def test_varlen_bad_gqa_and_dtype(interpret):
    from rocmflash import flash_attn_varlen_func

    args = _good()
    args["k"] = args["v"] = torch.randn(14, 3, 32).to(torch.float16)
    with pytest.raises(ValueError, match="multiple of key/value heads"):
        flash_attn_varlen_func(**args)
    args = _good()
    args["q"] = args["q"].float()
    with pytest.raises(TypeError, match="q.dtype"):
        flash_attn_varlen_func(**args)
