"""Paged prefill: ``flash_attn_varlen_func(..., block_table=...)`` over page pools (flash-attn 2.8's form), on the
CPU through Triton's interpreter: the same answer as the packed call on the same keys (and an fp64 reference),
gradients that reach the pages the call read, every return form, and bad pages clamped and reported -- through the
error word by default, with the index and value under ``check_values=True`` -- never a read outside the pool."""

import math

import pytest
import torch

import rocmflash
from varlen_reference import rel_err, varlen_fp64

pytestmark = [pytest.mark.usefixtures("interpret")]

PAGE = 4
LENS_Q, LENS_K = [3, 0, 6], [5, 0, 13]
HQ, HKV, D = 4, 2, 32


def _inputs(seed=0, grad=False):
    """q, packed k/v, their page pools (shuffled pages, spare pages of noise) and the block table."""
    gen = torch.Generator().manual_seed(seed)
    cu_q = torch.tensor([0] + torch.tensor(LENS_Q).cumsum(0).tolist(), dtype=torch.int32)
    cu_k = torch.tensor([0] + torch.tensor(LENS_K).cumsum(0).tolist(), dtype=torch.int32)
    q = torch.randn(int(cu_q[-1]), HQ, D, generator=gen).half()
    k, v = (torch.randn(int(cu_k[-1]), HKV, D, generator=gen).half() for _ in range(2))
    cols = -(-max(LENS_K) // PAGE)
    blocks = len(LENS_K) * cols + 3
    order = torch.randperm(blocks, generator=gen)
    table = order[:len(LENS_K) * cols].view(len(LENS_K), cols).to(torch.int32)
    pools = []
    for packed in (k, v):
        pool = torch.randn(blocks, PAGE, HKV, D, generator=gen).half()  # noise where no sequence's key lies
        for b, n in enumerate(LENS_K):
            for j in range(n):
                pool[table[b, j // PAGE], j % PAGE] = packed[cu_k[b] + j]
        pools.append(pool.requires_grad_(grad))
    return q.requires_grad_(grad), k, v, pools[0], pools[1], table, cu_q, cu_k


@pytest.mark.parametrize("causal,window", [(False, (-1, -1)), (True, (-1, -1)), (True, (3, -1))])
def test_paged_prefill_equals_the_packed_call_and_fp64(causal, window):
    q, k, v, kp, vp, table, cu_q, cu_k = _inputs()
    kw = dict(causal=causal, window_size=window, return_lse=True)
    out, lse = rocmflash.flash_attn_varlen_func(q, kp, vp, cu_q, cu_k, max(LENS_Q), max(LENS_K), block_table=table,
                                                **kw)
    ref_out, ref_lse = rocmflash.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(LENS_Q), max(LENS_K), **kw)
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
    fp64, _ = varlen_fp64(q, k, v, cu_q, cu_k, 1 / math.sqrt(D), causal, window)
    assert rel_err(out, fp64) < 1e-2


def test_paged_prefill_return_forms_and_gradients_reach_the_pages_read():
    q, k, v, kp, vp, table, cu_q, cu_k = _inputs(seed=1, grad=True)
    f = rocmflash.flash_attn_varlen_func
    out = f(q, kp, vp, cu_q, cu_k, max(LENS_Q), max(LENS_K), causal=True, block_table=table)
    probs = f(q, kp, vp, cu_q, cu_k, max(LENS_Q), max(LENS_K), causal=True, block_table=table,
              return_attn_probs=True)
    assert len(probs) == 3 and probs[2] is None and torch.equal(probs[0], out) and probs[1].shape == (HQ, q.shape[0])
    do = torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).half()
    dq, dkp, dvp = torch.autograd.grad((out.float() * do).sum(), (q, kp, vp))
    kd, vd = (t.detach().clone().requires_grad_() for t in (k, v))
    qd = q.detach().clone().requires_grad_()
    ref = f(qd, kd, vd, cu_q, cu_k, max(LENS_Q), max(LENS_K), causal=True)
    rq, rk, rv = torch.autograd.grad((ref.float() * do).sum(), (qd, kd, vd))
    assert torch.equal(dq, rq)
    read = torch.zeros(kp.shape[:2], dtype=torch.bool)
    for b, n in enumerate(LENS_K):
        for j in range(n):
            pos = (table[b, j // PAGE], j % PAGE)
            read[pos] = True
            assert torch.allclose(dkp[pos].float(), rk[cu_k[b] + j].float(), atol=1e-3)
            assert torch.allclose(dvp[pos].float(), rv[cu_k[b] + j].float(), atol=1e-3)
    assert not dkp[~read].any() and not dvp[~read].any()  # rows no sequence reads get no gradient


def test_a_page_outside_the_pool_is_clamped_and_reported():
    q, k, v, kp, vp, table, cu_q, cu_k = _inputs(seed=3)
    bad = table.clone()
    bad[2, 1] = kp.shape[0] + 5
    with pytest.raises(ValueError, match="block_table entry is outside the page pool"):
        rocmflash.flash_attn_varlen_func(q, kp, vp, cu_q, cu_k, max(LENS_Q), max(LENS_K), block_table=bad)
    with pytest.raises(ValueError, match=rf"block_table\[2, 1\]={kp.shape[0] + 5} is outside the page pool "
                                         rf"0\.\.{kp.shape[0] - 1}"):
        rocmflash.flash_attn_varlen_func(q, kp, vp, cu_q, cu_k, max(LENS_Q), max(LENS_K), block_table=bad,
                                         check_values=True)
    rocmflash.check_errors()  # nothing left over: the next good call is clean
    out = rocmflash.flash_attn_varlen_func(q, kp, vp, cu_q, cu_k, max(LENS_Q), max(LENS_K), block_table=table)
    assert torch.isfinite(out).all()


def test_bad_paged_arguments_are_one_line():
    q, k, v, kp, vp, table, cu_q, cu_k = _inputs(seed=4)
    f = rocmflash.flash_attn_varlen_func
    cases = [
        (dict(k=k, v=v, block_table=table), "with block_table, k must be a page pool"),
        (dict(block_table=table.long()), "block_table must be an int32 (batch, max_pages) tensor"),
        (dict(block_table=table[:2]), "block_table has 2 rows but cu_seqlens_k describes 3 sequences"),
        (dict(block_table=table[:, :1]), "fewer than max_seqlen_k=13"),
        (dict(v=vp[:, :2]), "k and v page pools must have the same shape"),
        (dict(k=kp.float(), v=vp.float()), "k.dtype must be torch.float16 or torch.bfloat16"),
    ]
    for kwargs, text in cases:
        args = dict(k=kp, v=vp, block_table=table)
        args.update(kwargs)
        with pytest.raises((ValueError, TypeError)) as err:
            f(q, args["k"], args["v"], cu_q, cu_k, max(LENS_Q), max(LENS_K), block_table=args["block_table"])
        assert text in str(err.value) and "\n" not in str(err.value), (text, str(err.value))


def test_paged_prefill_traces_whole_under_torch_compile():
    """The gather is torch ops and the kernel the varlen op: fullgraph, equal to the eager call."""
    q, k, v, kp, vp, table, cu_q, cu_k = _inputs(seed=5)

    def fn(q, kp, vp, table, cu_q, cu_k):
        return rocmflash.flash_attn_varlen_func(q, kp, vp, cu_q, cu_k, max(LENS_Q), max(LENS_K), causal=True,
                                                block_table=table)

    torch._dynamo.reset()
    try:
        out = torch.compile(fn, fullgraph=True, backend="aot_eager")(q, kp, vp, table, cu_q, cu_k)
    finally:
        torch._dynamo.reset()
    assert torch.equal(out, fn(q, kp, vp, table, cu_q, cu_k))
