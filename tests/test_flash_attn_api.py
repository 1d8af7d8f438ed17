"""flash-attn 2.8's whole Python API and flash-attn 3's ``flash_attn_interface`` (Triton's interpreter, CPU).

* Signatures: every function of ``flash_attn/flash_attn_interface.py`` (flash-attn 2.8.3) and of
  ``hopper/flash_attn_interface.py`` (flash-attn 3) against rocmflash's, parameter by parameter (names, order,
  kinds, defaults), from fixtures copied into ``tests/data`` as data (``extract_flash_attn_signatures.py``).
  rocmflash may add keyword-only parameters after flash-attn's; nothing else may differ.
* The packed forms against the unpacked call (values and gradients, which reach the packed tensor).
* ``flash_attn_with_kvcache``: rotary embedding (interleaved and not, rotary_dim < D, causal and not) against an
  fp64 reference of flash-attn's documented rules; ``cache_batch_idx`` (reads and appends land in the caller's
  cache rows); ``return_softmax_lse`` and the ``return_lse`` alias.
* Returns (``return_attn_probs``: flash-attn 2's triple, flash-attn 3's pair), ``deterministic``, the one-line
  ``NotImplementedError``s, flash-attn 3's ``seqused_q``/``seqused_k`` and ``flash_attn_combine(out=)``.
"""

import inspect
import json
import math
import pathlib

import pytest
import torch

from varlen_reference import attention_fp64, rel_err, varlen_fp64

DATA = pathlib.Path(__file__).parent / "data"
TOL = 1e-2  # fp16 inputs against fp64 references


def _fixture(name):
    return json.loads((DATA / name).read_text())["functions"]


def _check_signature(fn, want):
    """``fn``'s parameters start with exactly ``want``'s (names, order, kinds, defaults); any more are keyword-only."""
    params = list(inspect.signature(fn).parameters.values())
    kinds = {"positional_or_keyword": inspect.Parameter.POSITIONAL_OR_KEYWORD,
             "keyword_only": inspect.Parameter.KEYWORD_ONLY}
    assert len(params) >= len(want), (fn.__name__, [p.name for p in params])
    for got, spec in zip(params, want):
        assert got.name == spec["name"], (fn.__name__, got.name, spec["name"])
        assert got.kind == kinds[spec["kind"]], (fn.__name__, got.name, got.kind)
        if "default" in spec:
            default = list(got.default) if isinstance(got.default, tuple) else got.default
            assert default == spec["default"] and type(default) is type(spec["default"]), \
                (fn.__name__, got.name, got.default, spec["default"])
        else:
            assert got.default is inspect.Parameter.empty, (fn.__name__, got.name, got.default)
    for extra in params[len(want):]:  # rocmflash's own options: never positional, never in the way
        assert extra.kind == inspect.Parameter.KEYWORD_ONLY, (fn.__name__, extra.name)


FA2 = _fixture("flash_attn_2_8_signatures.json")
FA3 = _fixture("flash_attn_3_signatures.json")


def test_fixtures_hold_the_api():
    """The fixtures are what the tests below walk: a regenerated one that lost functions would pass vacuously."""
    assert set(FA2) == {"flash_attn_func", "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func",
                        "flash_attn_varlen_func", "flash_attn_varlen_kvpacked_func",
                        "flash_attn_varlen_qkvpacked_func", "flash_attn_with_kvcache"}
    assert {"flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache"} <= set(FA3)
    assert [p["name"] for p in FA2["flash_attn_with_kvcache"]][5:8] == ["rotary_cos", "rotary_sin", "cache_seqlens"]


@pytest.mark.parametrize("name", sorted(FA2))
def test_flash_attn_2_signature(name):
    """``import rocmflash as flash_attn``: each of flash-attn 2.8's functions, exported from the package."""
    import rocmflash

    assert name in rocmflash.__all__
    _check_signature(getattr(rocmflash, name), FA2[name])


@pytest.mark.parametrize("name", sorted(FA3))
def test_flash_attn_3_signature(name):
    from rocmflash import flash_attn_interface as fa3

    _check_signature(getattr(fa3, name), FA3[name])


def test_signature_check_can_fail():
    """The comparison sees a swapped pair, a changed default and an extra positional parameter."""
    want = FA2["flash_attn_func"]

    def swapped(q, k, v, dropout_p=0.0, causal=False, softmax_scale=None, window_size=(-1, -1), softcap=0.0,
                alibi_slopes=None, deterministic=False, return_attn_probs=False):
        pass

    def default(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, 0), softcap=0.0,
                alibi_slopes=None, deterministic=False, return_attn_probs=False):
        pass

    def extra(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
              alibi_slopes=None, deterministic=False, return_attn_probs=False, out=None):
        pass

    for fn in (swapped, default, extra):
        with pytest.raises(AssertionError):
            _check_signature(fn, want)


# ----------------------------------------------------------------------------- packed forms
def _rand(*shape, gen, dtype=torch.float16):
    return torch.randn(*shape, generator=gen).to(dtype)


def _grads(out, leaves, seed):
    do = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)).to(out.dtype)
    return torch.autograd.grad(out, leaves, do)


@pytest.mark.parametrize("causal", [False, True])
def test_qkvpacked_matches_unpacked(interpret, causal):
    import rocmflash

    gen = torch.Generator().manual_seed(1)
    qkv = _rand(2, 24, 3, 2, 32, gen=gen).requires_grad_(True)
    out = rocmflash.flash_attn_qkvpacked_func(qkv, causal=causal)
    (dqkv,) = _grads(out, [qkv], 2)
    ref = qkv.detach().double().requires_grad_(True)
    q, k, v = ref.unbind(2)
    want = torch.stack([attention_fp64(q[b], k[b], v[b], 32 ** -0.5, causal)[0] for b in range(2)])
    (dref,) = _grads(want, [ref], 2)
    assert rel_err(out, want) < TOL
    assert dqkv.shape == qkv.shape and rel_err(dqkv, dref) < 2 * TOL


def test_kvpacked_matches_unpacked_gqa(interpret):
    import rocmflash

    gen = torch.Generator().manual_seed(3)
    q = _rand(2, 8, 4, 32, gen=gen).requires_grad_(True)
    kv = _rand(2, 20, 2, 2, 32, gen=gen).requires_grad_(True)
    out, lse, probs = rocmflash.flash_attn_kvpacked_func(q, kv, causal=True, window_size=(6, 0),
                                                         return_attn_probs=True)
    assert probs is None
    grads = _grads(out, [q, kv], 4)
    k, v = kv.detach().unbind(2)
    plain_q = q.detach().clone().requires_grad_(True)
    plain_k, plain_v = [t.clone().requires_grad_(True) for t in (k, v)]
    want, want_lse, _ = rocmflash.flash_attn_func(plain_q, plain_k, plain_v, causal=True, window_size=(6, 0),
                                                  return_attn_probs=True)
    dq, dk, dv = _grads(want, [plain_q, plain_k, plain_v], 4)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)
    assert torch.equal(grads[0], dq) and torch.equal(grads[1], torch.stack((dk, dv), 2))
    ref = torch.stack([attention_fp64(q[b].detach(), k[b], v[b], 32 ** -0.5, True, (6, 0))[0] for b in range(2)])
    assert rel_err(out, ref) < TOL


def test_varlen_packed_forms_match_unpacked(interpret):
    import rocmflash

    gen = torch.Generator().manual_seed(5)
    cu = torch.tensor([0, 5, 5, 17], dtype=torch.int32)
    qkv = _rand(17, 3, 2, 32, gen=gen).requires_grad_(True)
    out = rocmflash.flash_attn_varlen_qkvpacked_func(qkv, cu, 12, causal=True)
    (dqkv,) = _grads(out, [qkv], 6)
    leaves = [t.detach().clone().requires_grad_(True) for t in qkv.detach().unbind(1)]
    want = rocmflash.flash_attn_varlen_func(*leaves, cu, cu, 12, 12, causal=True)
    assert torch.equal(out, want)
    assert torch.equal(dqkv, torch.stack(_grads(want, leaves, 6), 1))
    ref, _ = varlen_fp64(*qkv.detach().unbind(1), cu, cu, 32 ** -0.5, True)
    assert rel_err(out, ref) < TOL

    cu_k = torch.tensor([0, 9, 12, 30], dtype=torch.int32)
    q = _rand(17, 4, 32, gen=gen)
    kv = _rand(30, 2, 2, 32, gen=gen)
    out, lse, none = rocmflash.flash_attn_varlen_kvpacked_func(q, kv, cu, cu_k, 12, 18, return_attn_probs=True)
    want, want_lse = varlen_fp64(q, *kv.unbind(1), cu, cu_k, 32 ** -0.5)
    assert none is None and rel_err(out, want) < TOL and rel_err(lse, want_lse) < TOL


def test_packed_shape_errors():
    import rocmflash

    with pytest.raises(ValueError, match=r"qkv must be 5-D \(B, S, 3, H, D\)"):
        rocmflash.flash_attn_qkvpacked_func(torch.zeros(1, 4, 2, 2, 32, dtype=torch.float16))
    with pytest.raises(TypeError, match="kv must be a torch.Tensor"):
        rocmflash.flash_attn_varlen_kvpacked_func(torch.zeros(4, 2, 32), None, None, None, 4, 4)


# ----------------------------------------------------------------------------- varlen options
def test_varlen_fa2_returns_and_refusals(interpret):
    import rocmflash

    gen = torch.Generator().manual_seed(7)
    cu = torch.tensor([0, 6, 16], dtype=torch.int32)
    q, k, v = (_rand(16, 2, 32, gen=gen) for _ in range(3))
    out, lse, none = rocmflash.flash_attn_varlen_func(q, k, v, cu, cu, 10, 10, 0.0, None, True, (-1, -1), 0.0,
                                                      None, True, True)  # positionally, flash-attn's order
    want, want_lse = varlen_fp64(q, k, v, cu, cu, 32 ** -0.5, True)
    assert none is None and rel_err(out, want) < TOL and rel_err(lse, want_lse) < TOL
    old, old_lse = rocmflash.flash_attn_varlen_func(q, k, v, cu, cu, 10, 10, causal=True, return_lse=True)
    assert torch.equal(old, out) and torch.equal(old_lse, lse)
    with pytest.raises(NotImplementedError, match=r"^rocmflash: ALiBi \(alibi_slopes\) is not implemented"):
        rocmflash.flash_attn_varlen_func(q, k, v, cu, cu, 10, 10, alibi_slopes=torch.ones(2))
    with pytest.raises(ValueError, match=r"with block_table, k must be a page pool"):  # (paged prefill: k/v pages)
        rocmflash.flash_attn_varlen_func(q, k, v, cu, cu, 10, 10, block_table=torch.zeros(2, 1, dtype=torch.int32))
    with pytest.raises(NotImplementedError, match="dropout"):
        rocmflash.flash_attn_varlen_func(q, k, v, cu, cu, 10, 10, 0.1)
    with pytest.raises(TypeError, match="deterministic must be a bool"):
        rocmflash.flash_attn_varlen_func(q, k, v, cu, cu, 10, 10, deterministic=1)


def test_varlen_deterministic_keeps_rocmflash_kernels(interpret, monkeypatch):
    """``deterministic=True`` on a call needing gradients: never the platform's varlen attention (atomics)."""
    from rocmflash.api import varlen as VA

    asked = []
    monkeypatch.setattr(VA.VI, "served_key", lambda *a: asked.append(a) or ("problem",))
    monkeypatch.setattr(VA.VI, "excludes", lambda *a: None)
    gen = torch.Generator().manual_seed(8)
    cu = torch.tensor([0, 6, 16], dtype=torch.int32)
    q, k, v = (_rand(16, 2, 32, gen=gen).requires_grad_(True) for _ in range(3))
    assert not VA._incumbent_serves(q, k, v, cu, cu, 10, None, 0.0, VA.M.UNBOUNDED, 0, False, True)
    assert asked == []
    assert VA._incumbent_serves(q, k, v, cu, cu, 10, None, 0.0, VA.M.UNBOUNDED, 0, False, False)


# ----------------------------------------------------------------------------- kvcache: rotary, batch index
def _rotary_ref(x, cos, sin, positions, interleaved):
    """flash-attn's ``apply_rotary_emb`` in fp64, one position per (batch, token)."""
    x = x.double()
    rd = 2 * cos.shape[1]
    c, s = cos.double()[positions], sin.double()[positions]  # (B, S, rd / 2)
    if interleaved:
        c, s = c.repeat_interleave(2, -1), s.repeat_interleave(2, -1)
        x1, x2 = x[..., 0:rd:2], x[..., 1:rd:2]
        rot = torch.stack((-x2, x1), -1).flatten(-2)
    else:
        c, s = torch.cat((c, c), -1), torch.cat((s, s), -1)
        x1, x2 = x[..., :rd // 2], x[..., rd // 2:rd]
        rot = torch.cat((-x2, x1), -1)
    return torch.cat((x[..., :rd] * c[:, :, None] + rot * s[:, :, None], x[..., rd:]), -1)


@pytest.mark.parametrize("interleaved,causal,rotary_dim", [(True, True, 16), (False, True, 32), (False, False, 16),
                                                           (True, False, 32)])
def test_kvcache_rotary(interpret, interleaved, causal, rotary_dim):
    import rocmflash

    gen = torch.Generator().manual_seed(11)
    B, Sq, Hq, Hkv, D, cap = 2, 3, 4, 2, 32, 24
    lens = torch.tensor([5, 13], dtype=torch.int32)
    k_cache, v_cache = _rand(B, cap, Hkv, D, gen=gen), _rand(B, cap, Hkv, D, gen=gen)
    q, k, v = _rand(B, Sq, Hq, D, gen=gen), _rand(B, Sq, Hkv, D, gen=gen), _rand(B, Sq, Hkv, D, gen=gen)
    angle = torch.rand(cap, rotary_dim // 2, generator=gen) * 2 * math.pi
    cos, sin = torch.cos(angle).half(), torch.sin(angle).half()
    kc0, q0, k0 = k_cache.clone(), q.clone(), k.clone()
    out, lse = rocmflash.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cos, sin, lens, causal=causal,
                                                 rotary_interleaved=interleaved, return_softmax_lse=True)
    assert torch.equal(q, q0) and torch.equal(k, k0)  # the caller's tensors are not rotated in place
    steps = torch.arange(Sq)
    pos_k = lens[:, None].long() + steps
    pos_q = pos_k if causal else lens[:, None].long().expand(B, Sq)
    q_ro, k_ro = _rotary_ref(q, cos, sin, pos_q, interleaved), _rotary_ref(k, cos, sin, pos_k, interleaved)
    for b in range(B):
        n = int(lens[b])
        assert torch.equal(k_cache[b, :n], kc0[b, :n]) and torch.equal(k_cache[b, n + Sq:], kc0[b, n + Sq:])
        assert rel_err(k_cache[b, n:n + Sq], k_ro[b]) < 2e-3  # the rotated keys were appended
        keys = torch.cat((kc0[b, :n].double(), k_ro[b]))
        vals = torch.cat((v_cache[b, :n].double(), v[b].double()))
        want, want_lse = attention_fp64(q_ro[b], keys, vals, D ** -0.5, causal)
        assert rel_err(out[b], want) < TOL and rel_err(lse[b], want_lse) < TOL


def test_kvcache_rotary_refusals(interpret):
    import rocmflash

    q, kc = torch.zeros(1, 1, 2, 32, dtype=torch.float16), torch.zeros(1, 8, 2, 32, dtype=torch.float16)
    cos = torch.zeros(8, 8, dtype=torch.float16)
    with pytest.raises(ValueError, match="pass k and v to append"):
        rocmflash.flash_attn_with_kvcache(q, kc, kc.clone(), rotary_cos=cos, rotary_sin=cos, cache_seqlens=2)
    new = torch.zeros(1, 1, 2, 32, dtype=torch.float16)
    with pytest.raises(ValueError, match="rotary_cos has 4 positions but the cache holds 8 keys"):
        rocmflash.flash_attn_with_kvcache(q, kc, kc.clone(), new, new, cos[:4], cos[:4], 2)
    with pytest.raises(ValueError, match="rotary_dim <= head dim 32"):
        rocmflash.flash_attn_with_kvcache(q, kc, kc.clone(), new, new, torch.zeros(8, 17), torch.zeros(8, 17), 2)
    with pytest.raises(NotImplementedError, match=r"^rocmflash: ALiBi \(alibi_slopes\) is not implemented"):
        rocmflash.flash_attn_with_kvcache(q, kc, kc.clone(), alibi_slopes=torch.ones(2))


def test_kvcache_batch_idx_appends_in_place(interpret):
    """``cache_batch_idx``: batch row b reads and appends cache row ``idx[b]`` of the caller's tensors."""
    import rocmflash

    gen = torch.Generator().manual_seed(13)
    Bc, B, cap, Hkv, Hq, D = 4, 2, 20, 2, 4, 32
    k_cache, v_cache = _rand(Bc, cap, Hkv, D, gen=gen), _rand(Bc, cap, Hkv, D, gen=gen)
    idx = torch.tensor([3, 1], dtype=torch.int32)
    lens = torch.tensor([7, 12], dtype=torch.int32)
    q, k, v = _rand(B, 1, Hq, D, gen=gen), _rand(B, 1, Hkv, D, gen=gen), _rand(B, 1, Hkv, D, gen=gen)
    kc0, vc0 = k_cache.clone(), v_cache.clone()
    kc_ptr = k_cache.data_ptr()
    out = rocmflash.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lens, cache_batch_idx=idx,
                                            causal=True)
    assert k_cache.data_ptr() == kc_ptr
    for b in range(B):
        row, n = int(idx[b]), int(lens[b])
        assert torch.equal(k_cache[row, n], k[b, 0]) and torch.equal(v_cache[row, n], v[b, 0])
        assert torch.equal(k_cache[row, :n], kc0[row, :n]) and torch.equal(k_cache[row, n + 1:], kc0[row, n + 1:])
        want, _ = attention_fp64(q[b], k_cache[row, :n + 1], v_cache[row, :n + 1], D ** -0.5, True)
        assert rel_err(out[b], want) < TOL
    untouched = [r for r in range(Bc) if r not in idx.tolist()]
    assert torch.equal(k_cache[untouched], kc0[untouched]) and torch.equal(v_cache[untouched], vc0[untouched])
    # no lengths: every used row whole (flash-attn's default)
    whole = rocmflash.flash_attn_with_kvcache(q, k_cache, v_cache, cache_batch_idx=idx)
    for b in range(B):
        want, _ = attention_fp64(q[b], k_cache[int(idx[b])], v_cache[int(idx[b])], D ** -0.5)
        assert rel_err(whole[b], want) < TOL
    with pytest.raises(ValueError, match=r"cache_batch_idx must be \(B=2,\)"):
        rocmflash.flash_attn_with_kvcache(q, k_cache, v_cache, cache_batch_idx=idx[:1])
    with pytest.raises(NotImplementedError, match="cache_batch_idx with a paged cache"):
        rocmflash.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens, cache_batch_idx=idx,
                                          block_table=idx.view(2, 1))


def test_kvcache_lse_names(interpret):
    import rocmflash

    gen = torch.Generator().manual_seed(17)
    q, kc, vc = _rand(1, 1, 2, 32, gen=gen), _rand(1, 9, 2, 32, gen=gen), _rand(1, 9, 2, 32, gen=gen)
    new, old = (rocmflash.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=6, **kw)
                for kw in ({"return_softmax_lse": True}, {"return_lse": True}))
    assert torch.equal(new[0], old[0]) and torch.equal(new[1], old[1])
    want, want_lse = attention_fp64(q[0], kc[0, :6], vc[0, :6], 32 ** -0.5)
    assert rel_err(new[0][0], want) < TOL and rel_err(new[1][0], want_lse) < TOL


# ----------------------------------------------------------------------------- flash-attn 3
def test_fa3_func_order_and_returns(interpret):
    from rocmflash import flash_attn_interface as fa3

    gen = torch.Generator().manual_seed(19)
    q, k, v = _rand(2, 8, 4, 32, gen=gen), _rand(2, 12, 2, 32, gen=gen), _rand(2, 12, 2, 32, gen=gen)
    out = fa3.flash_attn_func(q, k, v, 0.2, True)  # softmax_scale, causal: flash-attn 3's positions
    got = fa3.flash_attn_func(q, k, v, 0.2, True, return_attn_probs=True)
    assert isinstance(got, tuple) and len(got) == 2 and torch.equal(got[0], out)
    for b in range(2):
        want, want_lse = attention_fp64(q[b], k[b], v[b], 0.2, True)
        assert rel_err(out[b], want) < TOL and rel_err(got[1][b], want_lse) < TOL
    packed = torch.cat((q, k[:, :8], v[:, :8]), 2)  # (B, S, Hq + 2 Hkv, D) with num_heads_q
    out4 = fa3.flash_attn_qkvpacked_func(packed, 0.2, True, num_heads_q=4)
    assert torch.equal(out4, fa3.flash_attn_func(q, k[:, :8], v[:, :8], 0.2, True))
    with pytest.raises(NotImplementedError, match=r"^rocmflash: qv"):
        fa3.flash_attn_func(q, k, v, qv=v)
    with pytest.raises(NotImplementedError, match=r"^rocmflash: chunked attention \(attention_chunk=4\)"):
        fa3.flash_attn_func(q, k, v, attention_chunk=4)


def test_fa3_varlen_seqused(interpret):
    """Only the first ``seqused[b]`` rows of each span take part; output rows past them are 0, and get no gradient."""
    from rocmflash import flash_attn_interface as fa3

    gen = torch.Generator().manual_seed(23)
    cu_q = torch.tensor([0, 6, 10, 19], dtype=torch.int32)
    cu_k = torch.tensor([0, 11, 15, 31], dtype=torch.int32)
    used_q = torch.tensor([4, 0, 9], dtype=torch.int32)
    used_k = torch.tensor([7, 3, 16], dtype=torch.int32)
    q = _rand(19, 4, 32, gen=gen).requires_grad_(True)
    k = _rand(31, 2, 32, gen=gen).requires_grad_(True)
    v = _rand(31, 2, 32, gen=gen).requires_grad_(True)
    out, lse = fa3.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 9, 16, used_q, used_k, causal=True,
                                          return_attn_probs=True)
    dq, dk, dv = _grads(out, [q, k, v], 24)
    ref = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    want = torch.zeros(19, 4, 32, dtype=torch.float64)
    want_lse = torch.full((4, 19), float("-inf"), dtype=torch.float64)
    parts = []
    for b in range(3):
        qs, ks = int(cu_q[b]), int(cu_k[b])
        nq, nk = int(used_q[b]), int(used_k[b])
        o, l = attention_fp64(ref[0][qs:qs + nq], ref[1][ks:ks + nk], ref[2][ks:ks + nk], 32 ** -0.5, True)
        parts.append((qs, nq, o, l))
    for qs, nq, o, l in parts:
        want = torch.cat((want[:qs], o, want[qs + nq:]))
        want_lse[:, qs:qs + nq] = l.detach()
    dref = _grads(want, ref, 24)
    assert rel_err(out, want) < TOL and torch.equal(lse.isinf(), want_lse.isinf())
    assert rel_err(lse[~lse.isinf()], want_lse[~want_lse.isinf()]) < TOL
    for got, w in zip((dq, dk, dv), dref):
        assert rel_err(got, w) < 2 * TOL
    assert torch.equal(dk[7:11], torch.zeros_like(dk[7:11]))  # unused keys of sequence 0: no gradient
    with pytest.raises(ValueError, match=r"seqused_k\[1\]=5 is outside its sequence's span 0..4"):
        fa3.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 9, 16, None, torch.tensor([7, 5, 16], dtype=torch.int32),
                                   check_values=True)
    with pytest.raises(NotImplementedError, match="fp8 packed attention"):
        fa3.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 9, 16, q_descale=torch.ones(3, 2))


def test_fa3_kvcache_order_and_returns(interpret):
    from rocmflash import flash_attn_interface as fa3

    gen = torch.Generator().manual_seed(29)
    B, Hq, Hkv, D, page = 2, 4, 2, 32, 8
    kc, vc = _rand(6, page, Hkv, D, gen=gen), _rand(6, page, Hkv, D, gen=gen)
    table = torch.tensor([[4, 1], [0, 5]], dtype=torch.int32)
    lens = torch.tensor([9, 3], dtype=torch.int32)
    q = _rand(B, 1, Hq, D, gen=gen)
    plain = fa3.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, page_table=table, num_splits=2,
                                        pack_gqa=True)
    out, lse, out_accum, lse_accum = fa3.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, page_table=table,
                                                                 return_softmax_lse=True)
    assert out_accum.numel() == 0 and lse_accum.numel() == 0
    for b in range(B):
        keys = torch.cat([kc[p] for p in table[b].tolist()])[:int(lens[b])]
        vals = torch.cat([vc[p] for p in table[b].tolist()])[:int(lens[b])]
        want, want_lse = attention_fp64(q[b], keys, vals, D ** -0.5)
        assert rel_err(plain[b], want) < TOL and rel_err(out[b], want) < TOL and rel_err(lse[b], want_lse) < TOL
    for kw, word in (({"q_descale": torch.ones(2, 2)}, "q_descale"), ({"rotary_seqlens": lens}, "rotary_seqlens"),
                     ({"cu_seqlens_q": lens}, "varlen queries"), ({"scheduler_metadata": lens}, "scheduler_metadata")):
        with pytest.raises(NotImplementedError, match=f"^rocmflash: {word}"):
            fa3.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, page_table=table, **kw)


def test_fa3_combine_out(interpret):
    from rocmflash import flash_attn_interface as fa3

    gen = torch.Generator().manual_seed(31)
    splits, B, S, H, D = 3, 2, 4, 2, 16
    lse_p = torch.randn(splits, B, S, H, generator=gen)
    lse_p[:, 0, 0, 0] = float("-inf")  # a row no split saw
    lse_p[1, 1, 2, 1] = float("-inf")  # one empty split
    out_p = torch.randn(splits, B, S, H, D, generator=gen)
    dest = torch.full((B, S, H, D), float("nan"), dtype=torch.bfloat16)
    out, lse = fa3.flash_attn_combine(out_p, lse_p, out=dest, out_dtype=torch.bfloat16)
    assert out is dest and lse.shape == (B, S, H)
    w = torch.softmax(lse_p.double(), 0).nan_to_num(0.0)
    want = (w[..., None] * out_p.double()).sum(0)
    assert rel_err(out, want) < 1e-2 and torch.equal(out[0, 0, 0], torch.zeros(D, dtype=torch.bfloat16))
    assert lse[0, 0, 0] == float("-inf") and rel_err(lse[1:], torch.logsumexp(lse_p.double(), 0)[1:]) < 1e-6
    with pytest.raises(ValueError, match=r"out must be torch.float32 \(2, 4, 2, 16\)"):
        fa3.flash_attn_combine(out_p, lse_p, out=dest)
