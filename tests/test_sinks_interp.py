"""Attention sinks (gpt-oss's ``s_aux``) in the dense and varlen kernels, forward and backward (interpreter, CPU).

The reference is transformers' eager gpt-oss formula in fp64: ``softmax(cat([q·kᵀ * scale, sink_h]))`` with the
sink column dropped (``modeling_gpt_oss.eager_attention_forward``); gradients are fp64 autograd of it. Inputs
are fresh ``torch.randn``, outputs of the kernel-level test are poisoned with NaN before the launch. Also: a
``-inf`` sink is no sink (bit for bit), calls with sinks never go to SDPA, the custom op path, and the one-line
errors for bad sinks.
"""

import math

import pytest
import torch

import rocmflash
from rocmflash.config import KernelConfig
from rocmflash.kernels import get_variant
from rocmflash.kernels.launch import observe_launches

from varlen_reference import band_mask, rel_err

pytestmark = [pytest.mark.usefixtures("interpret"), pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::RuntimeWarning")]

TOL = {torch.float16: 1e-2, torch.bfloat16: 2e-2}
SMALL = KernelConfig(BLOCK_M=16, BLOCK_N=16)


def eager_fp64(q, k, v, sinks, scale, causal=False, window=(-1, -1)):
    """gpt-oss's eager attention in fp64 on ``(B, H, S, D)``: ``(out, lse)``, the LSE over keys and the sink."""
    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = torch.einsum("bhqd,bhkd->bhqk", q, k) * scale
    s = s.masked_fill(~band_mask(q.shape[2], k.shape[2], causal, window), float("-inf"))
    sink = sinks.double().view(1, -1, 1, 1).expand(*s.shape[:3], 1)
    full = torch.cat([s, sink], -1)
    lse = torch.logsumexp(full, -1)
    p = torch.exp(full - lse[..., None])[..., :-1]  # the sink's column dropped
    return p @ v, lse


def _randn(*shape, gen, dtype=torch.float16):
    return torch.randn(*shape, generator=gen).to(dtype)


def _qkv(B, Hq, Hkv, Sq, Sk, D, seed, dtype=torch.float16):
    g = torch.Generator().manual_seed(seed)
    return (_randn(B, Hq, Sq, D, gen=g, dtype=dtype), _randn(B, Hkv, Sk, D, gen=g, dtype=dtype),
            _randn(B, Hkv, Sk, D, gen=g, dtype=dtype), 2 * torch.randn(Hq, generator=g))


# (B, Hq, Hkv, Sq, Sk, D)
SHAPES = [
    (1, 2, 2, 17, 17, 16),
    (1, 4, 2, 19, 27, 32),   # GQA, Sq < Sk
    (2, 4, 1, 23, 13, 32),   # MQA, Sq > Sk: causal rows that see no key see the sink alone
    (1, 2, 2, 1, 29, 64),    # one query
    (1, 2, 1, 9, 18, 80),    # two head-dim pieces (64 + 16)
]
IDS = ["B{}H{}x{}S{}x{}D{}".format(*s) for s in SHAPES]


@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_online_kernel_matches_eager_reference(shape, causal):
    """The online kernel with sinks: output and LSE against the eager formula, into NaN-poisoned buffers."""
    B, Hq, Hkv, Sq, Sk, D = shape
    q, k, v, sinks = _qkv(*shape, seed=hash((shape, causal)) % 2**31)
    scale = 1 / math.sqrt(D)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((B, Hq, Sq), float("nan"))
    get_variant("online").launch(q, k, v, SMALL, causal, scale, out=out, lse=lse, sinks=sinks.contiguous())
    ref_out, ref_lse = eager_fp64(q, k, v, sinks, scale, causal)
    assert rel_err(out, ref_out) < TOL[q.dtype]
    assert (lse.double() - ref_lse).abs().max().item() < 1e-4
    if causal and Sq > Sk:  # rows that see no key: output 0, LSE = the sink (softmax over the sink alone)
        assert torch.all(out[:, :, :Sq - Sk] == 0)
        assert torch.allclose(lse[:, :, :Sq - Sk], sinks.view(1, -1, 1).expand(B, Hq, Sq - Sk))


def _grads_ref(q, k, v, sinks, do, dlse, scale, causal, window=(-1, -1)):
    leaves = [x.detach().double().requires_grad_() for x in (q, k, v, sinks)]
    out, lse = eager_fp64(*leaves, scale, causal, window)
    ((out * do.double()).sum() + (lse * dlse.double()).sum()).backward()
    return out, lse, [x.grad for x in leaves]


@pytest.mark.parametrize("shape", SHAPES[1:3] + SHAPES[4:], ids=IDS[1:3] + IDS[4:])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_attention_forward_backward_matches_fp64_autograd(shape, causal, dtype):
    """``rocmflash.attention(..., sinks=)``: out, LSE, dq, dk, dv and dsinks (through the LSE too) against fp64
    autograd of the eager formula; the sinks' gradient comes back in their own dtype (bf16 here)."""
    B, Hq, Hkv, Sq, Sk, D = shape
    q, k, v, sinks = _qkv(*shape, seed=hash((shape, causal, str(dtype))) % 2**31, dtype=dtype)
    sinks = sinks.to(torch.bfloat16)
    g = torch.Generator().manual_seed(7)
    do, dlse = _randn(B, Hq, Sq, D, gen=g, dtype=dtype), torch.randn(B, Hq, Sq, generator=g)
    leaves = [x.clone().requires_grad_() for x in (q, k, v, sinks)]
    out, lse = rocmflash.attention(*leaves[:3], causal=causal, return_lse=True, sinks=leaves[3])
    ((out.float() * do.float()).sum() + (lse * dlse).sum()).backward()
    ref_out, ref_lse, ref_grads = _grads_ref(q, k, v, sinks, do, dlse, 1 / math.sqrt(D), causal)
    assert rel_err(out, ref_out) < TOL[dtype]
    assert (lse.double() - ref_lse).abs().max().item() < 1e-4
    for name, got, want in zip(("dq", "dk", "dv", "dsinks"), (x.grad for x in leaves), ref_grads):
        assert got.dtype == (torch.bfloat16 if name == "dsinks" else dtype)
        assert rel_err(got, want) < 2 * TOL[dtype], name


def test_minus_inf_sink_is_no_sink():
    """A ``-inf`` sink gives the kernel's no-sink answer bit for bit (exp(-inf) = 0), a zero sink gradient and no
    NaN, also for causal rows that see no key (Sq > Sk)."""
    q, k, v, _ = _qkv(1, 2, 1, 21, 13, 32, seed=3)
    none = torch.full((2,), float("-inf"), requires_grad=True)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out, lse = rocmflash.attention(*leaves, causal=True, return_lse=True, sinks=none)
    out.float().sum().backward()
    plain = [x.clone().requires_grad_() for x in (q, k, v)]
    out0, lse0 = rocmflash.attention(*plain, causal=True, return_lse=True)
    out0.float().sum().backward()
    assert torch.equal(out, out0) and torch.equal(lse, lse0)
    assert torch.isneginf(lse[:, :, :8]).all()
    for got, want in zip(leaves, plain):
        assert torch.equal(got.grad, want.grad)
    assert torch.equal(none.grad, torch.zeros(2))


def test_sinks_never_served_by_sdpa(monkeypatch):
    """A call whose plan serves an SDPA backend (pinned to cuDNN, which refuses CPU tensors) runs rocmflash's
    online kernel once sinks are given; a decode-shaped call with sinks runs it too (the decode kernel has none)."""
    from rocmflash.api import attention as A
    from rocmflash.api import ops

    monkeypatch.setattr(ops, "_CALLS", {})
    monkeypatch.setattr(A, "_PLANS", {})
    q, k, v, sinks = _qkv(1, 2, 2, 8, 24, 32, seed=11)
    ops._call_plan(q, k, False).pin("cudnn")
    with pytest.raises(RuntimeError):  # the plan does serve SDPA: without sinks the call goes there
        rocmflash.attention(q, k, v)
    with observe_launches() as seen:
        out = rocmflash.attention(q, k, v, sinks=sinks)
    assert [r["kernel"] for r in seen] == ["_fwd_online"]
    assert rel_err(out, eager_fp64(q, k, v, sinks, 32 ** -0.5)[0]) < TOL[q.dtype]
    q1, k1, v1, sinks1 = _qkv(2, 4, 1, 1, 300, 32, seed=12)  # decode-shaped
    with observe_launches() as seen:
        out = rocmflash.attention(q1, k1, v1, sinks=sinks1)
    assert [r["kernel"] for r in seen] == ["_fwd_online"]
    assert rel_err(out, eager_fp64(q1, k1, v1, sinks1, 32 ** -0.5)[0]) < TOL[q.dtype]


def test_custom_op_forward_and_gradients():
    """``torch.ops.rocmflash.attn_fwd(..., sinks)``, its autograd (``attn_bwd_sinks``) and its fake implementation."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    q, k, v, sinks = _qkv(1, 4, 2, 13, 19, 32, seed=5)
    scale = 32 ** -0.5
    leaves = [x.clone().requires_grad_() for x in (q, k, v, sinks)]
    out, lse = torch.ops.rocmflash.attn_fwd(*leaves[:3], True, scale, "online", SMALL.to_json(), leaves[3])
    g = torch.Generator().manual_seed(1)
    do, dlse = _randn(*q.shape, gen=g), torch.randn(*lse.shape, generator=g)
    ((out.float() * do.float()).sum() + (lse * dlse).sum()).backward()
    ref_out, ref_lse, ref_grads = _grads_ref(q, k, v, sinks, do, dlse, scale, True)
    assert rel_err(out, ref_out) < TOL[q.dtype] and (lse.double() - ref_lse).abs().max().item() < 1e-4
    for name, got, want in zip(("dq", "dk", "dv", "dsinks"), (x.grad for x in leaves), ref_grads):
        assert rel_err(got, want) < 2 * TOL[q.dtype], name
    with FakeTensorMode() as mode:
        fq, fk, fv, fs = (mode.from_tensor(x) for x in (q, k, v, sinks))
        fout, flse = torch.ops.rocmflash.attn_fwd(fq, fk, fv, True, scale, "online", "", fs)
        grads = torch.ops.rocmflash.attn_bwd_sinks(fout, fq, fk, fv, fout, flse, None, fs, True, scale)
    assert fout.shape == q.shape and flse.shape == (1, 4, 13) and grads[3].shape == (4,)


def _packed(lengths_q, lengths_k, Hq, Hkv, D, seed):
    g = torch.Generator().manual_seed(seed)
    cu_q = torch.tensor([0] + list(torch.tensor(lengths_q).cumsum(0)), dtype=torch.int32)
    cu_k = torch.tensor([0] + list(torch.tensor(lengths_k).cumsum(0)), dtype=torch.int32)
    q = _randn(int(cu_q[-1]), Hq, D, gen=g)
    k, v = _randn(int(cu_k[-1]), Hkv, D, gen=g), _randn(int(cu_k[-1]), Hkv, D, gen=g)
    return q, k, v, 2 * torch.randn(Hq, generator=g), cu_q, cu_k


def _varlen_ref(q, k, v, sinks, cu_q, cu_k, do, dlse, scale, causal, window=(-1, -1)):
    """Per sequence: the eager formula's out/LSE and fp64 autograd of ``sum(out * do) + sum(lse * dlse)``."""
    leaves = [x.detach().double().requires_grad_() for x in (q, k, v, sinks)]
    outs, lses = [], []
    for b in range(len(cu_q) - 1):
        qs, ks = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        o, lse = eager_fp64(*(x[s].transpose(0, 1)[None] for x, s in zip(leaves[:3], (qs, ks, ks))), leaves[3],
                            scale, causal, window)
        outs.append(o[0].transpose(0, 1))
        lses.append(lse[0])
    out, lse = torch.cat(outs), torch.cat(lses, 1)
    ((out * do.double()).sum() + (lse * dlse.double()).sum()).backward()
    return out, lse, [x.grad for x in leaves]


@pytest.mark.parametrize("causal, window", [(False, (-1, -1)), (True, (-1, -1)), (True, (5, -1))],
                         ids=["full", "causal", "window"])
def test_varlen_forward_backward_matches_fp64_autograd(causal, window):
    """``flash_attn_varlen_func(..., s_aux=)``: ragged lengths (a zero-length sequence, Sq > Sk in one), GQA,
    through the LSE too (``return_lse``)."""
    lq, lk = [7, 0, 19, 12], [11, 5, 19, 6]
    q, k, v, sinks, cu_q, cu_k = _packed(lq, lk, 4, 2, 32, seed=hash((causal, window)) % 2**31)
    g = torch.Generator().manual_seed(2)
    do, dlse = _randn(*q.shape, gen=g), torch.randn(4, q.shape[0], generator=g)
    leaves = [x.clone().requires_grad_() for x in (q, k, v, sinks)]
    out, lse = rocmflash.flash_attn_varlen_func(*leaves[:3], cu_q, cu_k, max(lq), max(lk), causal=causal,
                                                window_size=window, return_lse=True, s_aux=leaves[3])
    ((out.float() * do.float()).sum() + (lse * dlse).sum()).backward()
    ref_out, ref_lse, ref_grads = _varlen_ref(q, k, v, sinks, cu_q, cu_k, do, dlse, 32 ** -0.5, causal, window)
    assert rel_err(out, ref_out) < TOL[q.dtype] and (lse.double() - ref_lse).abs().max().item() < 1e-4
    for name, got, want in zip(("dq", "dk", "dv", "dsinks"), (x.grad for x in leaves), ref_grads):
        assert rel_err(got, want) < 2 * TOL[q.dtype], name


def test_packed_varlen_rows_past_the_last_sequence_add_nothing():
    """The HF integration's packing (``packed_varlen``: ``cu_seqlens`` stop short of the packed rows): the unused
    rows are zero in the output and gradients and add nothing to the sinks' gradient."""
    from rocmflash.api.varlen import packed_varlen

    q, k, v, sinks, cu_q, cu_k = _packed([9, 14], [9, 14], 2, 1, 32, seed=21)
    pad = _randn(5, 2, 32, gen=torch.Generator().manual_seed(4))
    qp, kp, vp = torch.cat([q, pad]), torch.cat([k, pad[:, :1]]), torch.cat([v, pad[:, :1]])
    leaves = [x.clone().requires_grad_() for x in (qp, kp, vp, sinks)]
    out = packed_varlen(*leaves[:3], cu_q, cu_k, 14, 14, 32 ** -0.5, True, -1, 0.0, sinks=leaves[3])
    do = _randn(*qp.shape, gen=torch.Generator().manual_seed(6))
    (out.float() * do.float()).sum().backward()
    ref_out, _, ref_grads = _varlen_ref(q, k, v, sinks, cu_q, cu_k, do[:23], torch.zeros(2, 23), 32 ** -0.5, True)
    assert torch.all(out[23:] == 0) and torch.all(leaves[0].grad[23:] == 0)
    assert rel_err(out[:23], ref_out) < TOL[q.dtype]
    assert rel_err(leaves[3].grad, ref_grads[3]) < 2 * TOL[q.dtype]
    assert rel_err(leaves[0].grad[:23], ref_grads[0]) < 2 * TOL[q.dtype]


def test_flash_attn_func_s_aux_plain_and_windowed():
    """``flash_attn_func(..., s_aux=)`` on ``(B, S, H, D)``: the dense kernel, and with a window the packed one."""
    q, k, v, sinks = _qkv(2, 4, 2, 15, 15, 32, seed=8)
    bshd = [x.transpose(1, 2).contiguous() for x in (q, k, v)]
    for window in ((-1, -1), (4, -1)):
        out = rocmflash.flash_attn_func(*bshd, causal=True, window_size=window, s_aux=sinks)
        ref = eager_fp64(q, k, v, sinks, 32 ** -0.5, True, window)[0].transpose(1, 2)
        assert rel_err(out, ref) < TOL[q.dtype], window


def test_bad_sinks_raise_one_line_errors():
    """Wrong type, dtype, shape or device, another variant, fp8 inputs, and (with ``check_values=True``) NaN values:
    each a one-line ValueError."""
    q, k, v, sinks = _qkv(1, 2, 2, 8, 8, 32, seed=9)
    cases = [
        (dict(sinks=[0.0, 1.0]), "sinks must be a floating-point tensor of shape (Hq,) = (2,)"),
        (dict(sinks=torch.zeros(2, dtype=torch.int32)), "got dtype torch.int32"),
        (dict(sinks=torch.zeros(3)), "got shape (3,)"),
        (dict(sinks=torch.zeros(1, 2)), "got shape (1, 2)"),
        (dict(sinks=torch.zeros(2, device="meta")), "sinks is on meta but q is on cpu"),
        (dict(sinks=sinks, variant="split_kv"), "variant='split_kv' has no attention-sink support"),
        (dict(sinks=sinks, variant="two_phase"), "variant='two_phase' has no attention-sink support"),
    ]
    for kwargs, text in cases:
        with pytest.raises(ValueError) as err:
            rocmflash.attention(q, k, v, **kwargs)
        assert text in str(err.value) and "\n" not in str(err.value), (kwargs, str(err.value))
    fp8 = [x.to(torch.float8_e4m3fnuz) for x in (q, k, v)]
    with pytest.raises(ValueError, match="fp8 attention .* has no attention-sink support"):
        rocmflash.attention(*fp8, sinks=sinks)
    with pytest.raises(ValueError, match=r"s_aux must be a floating-point tensor of shape \(Hq,\) = \(2,\)"):
        rocmflash.flash_attn_func(*(x.transpose(1, 2) for x in (q, k, v)), s_aux=torch.zeros(4))
    cu = torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"s_aux\[0\] is nan"):
        rocmflash.flash_attn_varlen_func(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), cu, cu,
                                         8, 8, s_aux=torch.tensor([float("nan"), 0.0]), check_values=True)


def test_nan_and_inf_sinks_give_what_the_eager_formula_gives_without_a_host_read():
    """The values are not read by default (a host wait per training step otherwise): a NaN sink gives NaN rows for
    its own head only and a ``+inf`` sink zero rows (all weight on the sink), as torch's
    ``softmax(cat([scores, sink]))`` does; the other head is unchanged."""
    q, k, v, sinks = _qkv(1, 2, 2, 8, 8, 32, seed=10)
    good = rocmflash.attention(q, k, v, sinks=sinks, config=SMALL)
    for bad in (float("nan"), float("inf")):
        odd = sinks.clone()
        odd[1] = bad
        out = rocmflash.attention(q, k, v, sinks=odd, config=SMALL)
        ref = eager_fp64(q, k, v, odd, 32 ** -0.5, False, (-1, -1))[0]
        if bad != bad:
            assert torch.isnan(ref[:, 1]).all() and torch.isnan(out[:, 1]).all()
        else:
            assert torch.equal(ref[:, 1], torch.zeros_like(ref[:, 1]))
            assert torch.equal(out[:, 1].float(), ref[:, 1].float())
        assert torch.equal(out[:, 0], good[:, 0]), bad
    odd = sinks.clone()
    odd[0] = float("nan")
    cu = torch.tensor([0, 8], dtype=torch.int32)
    varlen = rocmflash.flash_attn_varlen_func(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), cu,
                                              cu, 8, 8, s_aux=odd)
    assert torch.isnan(varlen[:, 0]).all() and not torch.isnan(varlen[:, 1]).any()


def test_opcheck_and_dynamo_fullgraph_with_sinks():
    """``torch.library.opcheck`` of ``attn_fwd`` with sinks (schema, fake impl, autograd registration) and
    ``torch.compile(fullgraph=True, backend="aot_eager")`` of ``attention(..., sinks=)``, forward and backward:
    the same values and gradients as eager (the interpreter runs the ops; the GPU test runs Inductor)."""
    q, k, v, sinks = _qkv(1, 2, 1, 17, 17, 32, seed=13)
    torch.library.opcheck(torch.ops.rocmflash.attn_fwd.default, (q, k, v, True, 32 ** -0.5, "online", "", sinks),
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))
    torch._dynamo.reset()
    try:
        leaves = [x.clone().requires_grad_() for x in (q, k, v, sinks)]

        def fn(q, k, v, s):
            return rocmflash.attention(q, k, v, causal=True, sinks=s)

        eager = fn(*leaves)
        g_eager = torch.autograd.grad(eager.float().square().sum(), leaves)
        out = torch.compile(fn, fullgraph=True, backend="aot_eager")(*leaves)
        g = torch.autograd.grad(out.float().square().sum(), leaves)
        assert torch.equal(out, eager)
        for a, b in zip(g, g_eager):
            assert torch.allclose(a, b)
    finally:
        torch._dynamo.reset()
