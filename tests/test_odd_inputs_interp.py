"""Odd-but-legal and bad inputs at every attention entry point, in Triton's interpreter (CPU).

- ``flash_attn_func(window_size=..., softcap=...)`` (flash-attn 2's arguments) against fp64,
  forward and gradients, and ``return_attn_probs``/``alibi_slopes``/``deterministic``;
- a zero or negative ``softmax_scale`` gives ``softmax(scale * q·k) v`` (the kernels take the row
  maximum of the raw scores, so the sign is folded into q: rocmflash/api/scale.py);
- tensors on the meta device are refused with one line naming it;
- every kernel launch of every entry point runs under ``launch.on_device(q)``: with tensors on a
  GPU that is not the current one, Triton would otherwise launch on the current GPU.
"""

import contextlib
import math

import pytest
import torch

from varlen_reference import attention_fp64, rel_err

TOL = {torch.float16: 1e-2, torch.bfloat16: 2.5e-2}


def _batch(B, Sq, Sk, Hq, Hkv, D, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Sq, Hq, D, generator=gen).to(dtype)
    k = torch.randn(B, Sk, Hkv, D, generator=gen).to(dtype)
    v = torch.randn(B, Sk, Hkv, D, generator=gen).to(dtype)
    return q, k, v


def _reference(q, k, v, scale, causal=False, window=(-1, -1), softcap=0.0):
    """fp64 ``(out (B, Sq, Hq, D), lse (B, Hq, Sq))`` of a (B, S, H, D) batch, one sequence per row."""
    outs, lses = zip(*(attention_fp64(q[b], k[b], v[b], scale, causal, window, softcap) for b in range(q.shape[0])))
    return torch.stack(outs), torch.stack(lses)


@pytest.mark.parametrize("Sq,Sk,group,causal,window,softcap", [
    (97, 97, 1, True, (32, -1), 0.0),     # Mistral: causal sliding window
    (65, 130, 4, False, (17, 9), 0.0),    # two-sided window, more keys than queries, GQA
    (80, 80, 2, True, (-1, -1), 30.0),    # Gemma 2: causal + soft-cap
    (33, 70, 1, False, (20, -1), 5.0),    # window and cap together
])
def test_flash_attn_func_window_softcap(interpret, Sq, Sk, group, causal, window, softcap):
    from rocmflash import flash_attn_func

    dtype = torch.bfloat16
    q, k, v = _batch(2, Sq, Sk, 2 * group, 2, 64, dtype, seed=Sq + Sk)
    for t in (q, k, v):
        t.requires_grad_(True)
    out, lse, probs = flash_attn_func(q, k, v, causal=causal, window_size=window, softcap=softcap,
                                      return_attn_probs=True)
    assert probs is None and out.shape == q.shape and lse.shape == (2, 2 * group, Sq)
    qd, kd, vd = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    ref_out, ref_lse = _reference(qd, kd, vd, 1 / math.sqrt(64), causal, window, softcap)
    seen = torch.isfinite(ref_lse)
    assert torch.isfinite(out).all() and rel_err(out, ref_out) < TOL[dtype]
    assert torch.equal(torch.isfinite(lse), seen)
    assert (lse[seen].double() - ref_lse[seen]).abs().max().item() < 1e-3
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(dtype)
    (out.float() * dout.float()).sum().backward()
    (ref_out * dout.double()).sum().backward()
    for name, got, want in (("dq", q.grad, qd.grad), ("dk", k.grad, kd.grad), ("dv", v.grad, vd.grad)):
        assert rel_err(got, want) < 2 * TOL[dtype], name


def test_flash_attn_func_window_takes_strided_inputs(interpret):
    """A (B, H, S, D) tensor transposed to (B, S, H, D) is not packable as a view: it is reshaped, same answer."""
    from rocmflash import flash_attn_func

    q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in _batch(2, 40, 40, 2, 2, 32, torch.float16, 3))
    assert not q.is_contiguous()
    out = flash_attn_func(q, k, v, window_size=(8, 8))
    ref, _ = _reference(q, k, v, 1 / math.sqrt(32), window=(8, 8))
    assert rel_err(out, ref) < TOL[torch.float16]


def test_flash_attn_func_plain_call_unchanged_and_lse(interpret):
    """No window, no cap: the dense kernel (not the packed one); return_attn_probs gives its LSE."""
    from rocmflash import flash_attn_func
    from rocmflash.kernels.launch import observe_launches

    q, k, v = _batch(1, 50, 50, 4, 2, 64, torch.float16, 4)
    with observe_launches() as seen:
        out, lse, _ = flash_attn_func(q, k, v, causal=True, window_size=(-1, 0), return_attn_probs=True)
    assert [r["kernel"] for r in seen] and not any("varlen" in r["kernel"] for r in seen)
    ref, ref_lse = _reference(q, k, v, 1 / math.sqrt(64), causal=True)
    assert rel_err(out, ref) < TOL[torch.float16] and (lse.double() - ref_lse).abs().max() < 1e-3


@pytest.mark.parametrize("kwargs,exc,words", [
    (dict(alibi_slopes=torch.ones(2)), NotImplementedError, "alibi_slopes"),
    (dict(window_size=(3,)), ValueError, "window_size"),
    (dict(window_size=(-2, 0)), ValueError, "window_size"),
    (dict(softcap=-1.0), ValueError, "softcap"),
    (dict(deterministic="yes"), TypeError, "deterministic"),
    (dict(return_attn_probs=1), TypeError, "return_attn_probs"),
])
def test_flash_attn_func_bad_options(interpret, kwargs, exc, words):
    from rocmflash import flash_attn_func

    q, k, v = _batch(1, 8, 8, 2, 2, 32, torch.float16, 5)
    with pytest.raises(exc, match=words):
        flash_attn_func(q, k, v, **kwargs)


# ----------------------------------------------------------------------------- zero and negative scales
def _scaled_entry_points():
    """name -> fn(q, k, v, scale, causal) returning (B, Sq, Hq, D), for (B, S, H, D) inputs."""
    import rocmflash
    from rocmflash import flash_attn_varlen_func, flash_attn_with_kvcache

    def varlen(q, k, v, scale, causal):
        B, Sq, Hq, D = q.shape
        Sk = k.shape[1]
        cu_q = torch.arange(0, (B + 1) * Sq, Sq, dtype=torch.int32)
        cu_k = torch.arange(0, (B + 1) * Sk, Sk, dtype=torch.int32)
        out = flash_attn_varlen_func(q.reshape(-1, Hq, D), k.reshape(-1, k.shape[2], D), v.reshape(-1, k.shape[2], D),
                                     cu_q, cu_k, Sq, Sk, softmax_scale=scale, causal=causal)
        return out.view(q.shape)

    return {
        "attention": lambda q, k, v, s, c: rocmflash.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                               causal=c, softmax_scale=s).transpose(1, 2),
        "flash_attn_func": lambda q, k, v, s, c: rocmflash.flash_attn_func(q, k, v, softmax_scale=s, causal=c),
        "flash_attn_func+window": lambda q, k, v, s, c: rocmflash.flash_attn_func(q, k, v, softmax_scale=s, causal=c,
                                                                                  window_size=(24, 24)),
        "varlen": varlen,
        "kvcache": lambda q, k, v, s, c: flash_attn_with_kvcache(q, k, v, cache_seqlens=k.shape[1],
                                                                 softmax_scale=s, causal=c),
    }


@pytest.mark.parametrize("entry", ["attention", "flash_attn_func", "flash_attn_func+window", "varlen", "kvcache"])
@pytest.mark.parametrize("scale", [0.0, -0.125, -1])
def test_zero_and_negative_softmax_scale(interpret, entry, scale):
    fn = _scaled_entry_points()[entry]
    Sq = 4 if entry == "kvcache" else 48
    q, k, v = _batch(2, Sq, 64, 4, 2, 32, torch.float16, seed=11)
    window = (24, 24) if "window" in entry else (-1, -1)
    out = fn(q, k, v, scale, True)
    ref, _ = _reference(q, k, v, float(scale), causal=True, window=window)
    assert torch.isfinite(out).all(), f"{entry}: NaN/inf at scale {scale}"
    assert rel_err(out, ref) < TOL[torch.float16], (entry, scale, rel_err(out, ref))


def test_negative_scale_gradients(interpret):
    """The fold keeps autograd exact: d/dq through -q, and zero gradient into q at scale 0."""
    import rocmflash

    for scale in (-0.2, 0.0):
        q, k, v = _batch(1, 32, 32, 2, 2, 32, torch.float16, seed=13)
        for t in (q, k, v):
            t.requires_grad_(True)
        out = rocmflash.flash_attn_func(q, k, v, softmax_scale=scale, causal=True)
        qd, kd, vd = (t.detach().double().requires_grad_(True) for t in (q, k, v))
        ref, _ = _reference(qd, kd, vd, scale, causal=True)
        dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(torch.float16)
        (out.float() * dout.float()).sum().backward()
        (ref * dout.double()).sum().backward()
        for name, got, want in (("dq", q.grad, qd.grad), ("dk", k.grad, kd.grad), ("dv", v.grad, vd.grad)):
            assert rel_err(got, want) < 2e-2, (scale, name, rel_err(got, want))


# ----------------------------------------------------------------------------- meta tensors
@pytest.mark.parametrize("entry", ["attention", "flash_attn_func", "flash_attn_func+window", "varlen", "kvcache"])
@pytest.mark.parametrize("interpreted", [False, True])
def test_meta_tensors_are_refused_in_one_line(monkeypatch, entry, interpreted):
    monkeypatch.setenv("TRITON_INTERPRET", "1" if interpreted else "0")
    q, k, v = (torch.empty(1, 16, 2, 32, dtype=torch.float16, device="meta") for _ in range(3))
    fn = _scaled_entry_points()[entry]
    if entry == "varlen":
        with pytest.raises(ValueError, match="meta device"):
            from rocmflash import flash_attn_varlen_func

            cu = torch.tensor([0, 16], dtype=torch.int32, device="meta")
            flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 16, 16)
        return
    with pytest.raises(ValueError, match="meta device"):
        fn(q, k, v, None, False)


# ----------------------------------------------------------------------------- device guard
@pytest.mark.parametrize("entry", ["attention", "flash_attn_func", "flash_attn_func+window", "varlen", "kvcache"])
def test_every_launch_runs_on_the_tensors_device(interpret, monkeypatch, entry):
    """Each kernel launch happens inside ``launch.on_device(q)`` (forward, and backward where there is one)."""
    from rocmflash.kernels import launch as L

    depth = [0]
    guarded, unguarded = [], []
    real_launch = L.launch_kernel

    @contextlib.contextmanager
    def recording(t):
        assert isinstance(t, torch.Tensor)
        depth[0] += 1
        try:
            yield
        finally:
            depth[0] -= 1

    def launch(fn, *a, **kw):
        (guarded if depth[0] else unguarded).append(fn.__name__)
        return real_launch(fn, *a, **kw)

    monkeypatch.setattr(L, "on_device", recording)
    monkeypatch.setattr(L, "launch_kernel", launch)
    fn = _scaled_entry_points()[entry]
    q, k, v = _batch(1, 4 if entry == "kvcache" else 16, 16, 2, 2, 32, torch.float16, seed=17)
    grads = entry != "kvcache"
    for t in (q, k, v):
        t.requires_grad_(grads)
    out = fn(q, k, v, None, True)
    if grads:
        out.float().sum().backward()
    assert guarded and not unguarded, (guarded, unguarded)
