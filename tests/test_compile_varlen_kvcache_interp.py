"""torch.compile(fullgraph=True) over ``flash_attn_varlen_func`` and ``flash_attn_with_kvcache``, on CPU.

Both entry points trace into custom ops (``rocmflash::varlen_fwd``/``varlen_bwd``, ``rocmflash::kvcache_fwd``/
``kvcache_append_fwd``, :mod:`rocmflash.api.varlen_ops` and :mod:`rocmflash.api.decode_ops`). ``backend="aot_eager"``
runs the captured graphs eagerly, so the ops run Triton's interpreter: the compiled numbers are compared with the
eager call's (the same kernels and configs: equal) and with fp64 references (relative error), the caches an append
mutated with the eager call's, and the graphs are counted (one graph, no break). ``torch.library.opcheck`` checks
the schemas (declared mutations included), fake implementations and autograd registration. Buffers the kernels
fill are NaN-poisoned first. The GPU twin (Inductor) is ``tests/test_compile_varlen_kvcache_gpu.py``.
"""

import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import rocmflash
import rocmflash.api.ops  # noqa: F401  (registers torch.ops.rocmflash)
from varlen_reference import attention_fp64, rel_err, varlen_fp64

pytestmark = [pytest.mark.usefixtures("interpret"), pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::UserWarning")]

TOL = 1e-2  # fp16 against fp64


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class Graphs:
    """A counting backend: keeps each captured graph, runs it as ``aot_eager`` does (AOTAutograd, eager graphs)."""

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        from torch._dynamo.backends.debugging import aot_eager

        self.graphs.append(gm)
        return aot_eager(gm, example_inputs)

    def targets(self) -> list:
        return [str(n.target) for gm in self.graphs for n in gm.graph.nodes if n.op == "call_function"]

    def traced_outputs(self, op: str) -> list:
        """``(shape, stride, dtype)`` of each output of the first call of ``op`` as the trace saw it (its fake)."""
        node = next(n for gm in self.graphs for n in gm.graph.nodes if op in str(n.target))
        return [(tuple(t.shape), t.stride(), t.dtype) for t in node.meta["example_value"]]


def _no_breaks(fn, *args, **kwargs):
    explained = torch._dynamo.explain(fn)(*args, **kwargs)
    assert explained.graph_count == 1 and explained.graph_break_count == 0, explained.break_reasons
    torch._dynamo.reset()


# ----------------------------------------------------------------------------- varlen
def _packed(lens_q, lens_k, hq=4, hkv=2, d=32, seed=0, grad=False):
    gen = torch.Generator().manual_seed(seed)
    cu_q = torch.tensor([0] + torch.tensor(lens_q).cumsum(0).tolist(), dtype=torch.int32)
    cu_k = torch.tensor([0] + torch.tensor(lens_k).cumsum(0).tolist(), dtype=torch.int32)
    q, k, v = (torch.randn(int(cu[-1]), h, d, generator=gen).half().requires_grad_(grad)
               for cu, h in ((cu_q, hq), (cu_k, hkv), (cu_k, hkv)))
    return q, k, v, cu_q, cu_k


def _varlen_step(q, k, v, cu_q, cu_k, max_q, max_k):
    out, lse = rocmflash.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, causal=True, window_size=(6, -1),
                                                return_lse=True)
    return out * 2, lse  # a little work around the op (Inductor fuses it on a GPU)


def test_varlen_forward_traces_whole_and_matches_eager_and_fp64(poisoned):
    q, k, v, cu_q, cu_k = _packed([3, 0, 9], [5, 4, 11])
    _no_breaks(_varlen_step, q, k, v, cu_q, cu_k, 9, 11)
    graphs = Graphs()
    out, lse = torch.compile(_varlen_step, fullgraph=True, backend=graphs)(q, k, v, cu_q, cu_k, 9, 11)
    assert len(graphs.graphs) == 1 and any("rocmflash.varlen_fwd" in t for t in graphs.targets()), graphs.targets()
    eager_out, eager_lse = _varlen_step(q, k, v, cu_q, cu_k, 9, 11)
    assert torch.equal(out, eager_out) and torch.equal(lse, eager_lse)
    assert graphs.traced_outputs("varlen_fwd") == [(tuple(t.shape), t.stride(), t.dtype) for t in (out, lse)]
    ref_out, ref_lse = varlen_fp64(q, k, v, cu_q, cu_k, 1 / math.sqrt(32), True, (6, -1))
    assert rel_err(out / 2, ref_out) < TOL
    seen = torch.isfinite(ref_lse)  # the empty sequence has no rows; rows that see no key: -inf
    assert torch.equal(torch.isfinite(lse), seen) and rel_err(lse[seen], ref_lse[seen]) < 1e-3


def test_varlen_return_forms_under_compile():
    """``out`` alone, ``(out, lse)`` and flash-attn's ``(out, softmax_lse, None)``: as eagerly, shapes and all."""
    q, k, v, cu_q, cu_k = _packed([4, 7], [6, 7])
    f = rocmflash.flash_attn_varlen_func
    forms = {"out": lambda *a: f(*a, 7, 7),
             "lse": lambda *a: f(*a, 7, 7, return_lse=True),
             "probs": lambda *a: f(*a, 7, 7, return_attn_probs=True)}
    for name, fn in forms.items():
        got = torch.compile(fn, fullgraph=True, backend="aot_eager")(q, k, v, cu_q, cu_k)
        want = fn(q, k, v, cu_q, cu_k)
        if name == "out":
            assert torch.equal(got, want)
            continue
        assert len(got) == len(want) and got[0].shape == q.shape and got[1].shape == (4, 11), name
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        if name == "probs":
            assert got[2] is None and want[2] is None


def test_varlen_forward_backward_grads_match_eager_and_fp64():
    """fp16 forward + backward through the compiled graph (AOTAutograd: varlen_bwd), the LSE in the loss too."""
    q, k, v, cu_q, cu_k = _packed([5, 1, 12], [7, 3, 12], seed=1, grad=True)
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(2)).half()

    def loss(fn):
        out, lse = fn(q, k, v, cu_q, cu_k, 12, 12)
        return torch.autograd.grad((out.float() * do).sum() + lse.sum(), (q, k, v))

    graphs = Graphs()
    compiled = loss(torch.compile(_varlen_step, fullgraph=True, backend=graphs))
    assert len(graphs.graphs) == 1
    eager = loss(_varlen_step)
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref_out, ref_lse = varlen_fp64(qd, kd, vd, cu_q, cu_k, 1 / math.sqrt(32), True, (6, -1))
    ref = torch.autograd.grad((2 * ref_out * do.double()).sum() + ref_lse[torch.isfinite(ref_lse)].sum(),
                              (qd, kd, vd))
    for name, c, e, r in zip("qkv", compiled, eager, ref):
        assert torch.isfinite(c).all(), name
        assert torch.equal(c, e), name
        assert rel_err(c, r) < 2e-2, (name, rel_err(c, r))


def test_varlen_dynamic_lengths_reuse_one_graph():
    """A new packing and new max_seqlen per batch (ints traced as sizes): one graph, no recompile."""
    from torch._dynamo.testing import CompileCounterWithBackend

    counter = CompileCounterWithBackend("aot_eager")
    fn = torch.compile(_varlen_step, fullgraph=True, backend=counter, dynamic=True)
    compiles = []
    for lens_q, lens_k in (([3, 9], [5, 11]), ([6, 2, 4], [6, 8, 13]), ([17], [19])):
        q, k, v, cu_q, cu_k = _packed(lens_q, lens_k, seed=len(lens_q))
        out, lse = fn(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k))
        want, want_lse = _varlen_step(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k))
        assert torch.equal(out, want) and torch.equal(lse, want_lse)
        compiles.append(counter.frame_count)
    assert compiles[0] >= 1 and compiles == compiles[:1] * 3, compiles  # (dynamo may restart the first analysis)


def test_varlen_values_checked_at_run_time_under_compile():
    """Bad cu_seqlens values: the device-side check's error (CPU: read right after the launch), or with
    ``check_values=True`` the host check's (index and value), each raised by the compiled call."""
    q, k, v, _, cu_k = _packed([4, 6], [5, 5])
    bad_q = torch.tensor([1, 4, 10], dtype=torch.int32)  # does not start at 0
    fn = torch.compile(lambda *a, **kw: rocmflash.flash_attn_varlen_func(*a, 6, 5, **kw), fullgraph=True,
                       backend="aot_eager")
    with pytest.raises(ValueError, match="cu_seqlens_q must start at 0.*check_values=True"):
        fn(q, k, v, bad_q, cu_k)
    with pytest.raises(ValueError, match="cu_seqlens_q must start at 0, got 1"):
        fn(q, k, v, bad_q, cu_k, check_values=True)


def test_varlen_metadata_errors_keep_their_words_under_compile():
    """A bad argument's one-line error at trace time: the eager exception (torch.compile without fullgraph), its
    words inside dynamo's error with fullgraph=True."""
    q, k, v, cu_q, cu_k = _packed([4, 6], [5, 5])
    fn = lambda *a: rocmflash.flash_attn_varlen_func(*a, 6, 5)  # noqa: E731
    with pytest.raises(TypeError, match="cu_seqlens_q must have dtype torch.int32, got torch.int64"):
        torch.compile(fn, backend="aot_eager")(q, k, v, cu_q.long(), cu_k)
    with pytest.raises(Exception, match="cu_seqlens_q must have dtype torch.int32, got torch.int64"):
        torch.compile(fn, fullgraph=True, backend="aot_eager")(q, k, v, cu_q.long(), cu_k)


def test_varlen_opcheck_and_fake_layouts():
    q, k, v, cu_q, cu_k = _packed([3, 7], [4, 9], grad=True)
    args = (q, k, v, cu_q, cu_k, 7, 9, 0.2, 0.0, -1, 0, True, False)
    torch.library.opcheck(torch.ops.rocmflash.varlen_fwd.default, args)
    out, lse = torch.ops.rocmflash.varlen_fwd(*args)
    dq, dk, dv = (t.detach() for t in (q, k, v))
    for dlse in (None, torch.randn_like(lse)):
        torch.library.opcheck(torch.ops.rocmflash.varlen_bwd.default,
                              (torch.randn_like(out), dq, dk, dv, out.detach(), lse.detach(), dlse, cu_q, cu_k, 7, 9,
                               0.2, 0.0, -1, 0, True))
    # a q that is a view of packed qkv (not dense): the real and the fake output have the same strides
    q_view = torch.randn(10, 3, 4, 32).half()[:, 0]
    real = torch.ops.rocmflash.varlen_fwd(q_view, k.detach(), v.detach(), cu_q, cu_k, 7, 9, 0.2, 0.0, -1, -1, True,
                                          False)
    with FakeTensorMode() as mode:
        fake = torch.ops.rocmflash.varlen_fwd(*(mode.from_tensor(t) for t in (q_view, k, v, cu_q, cu_k)), 7, 9, 0.2,
                                              0.0, -1, -1, True, False)
    for r, f in zip(real, fake):
        assert (r.shape, r.stride(), r.dtype) == (f.shape, f.stride(), f.dtype)
    assert real[1].shape == (4, 10) and real[1].dtype == torch.float32


def test_packed_and_flash_attn_3_wrappers_trace_whole():
    """flash-attn 2's packed varlen form and flash-attn 3's interface reach the same ops: no graph break."""
    from rocmflash import flash_attn_interface as fa3

    q, k, v, cu_q, cu_k = _packed([3, 7], [3, 7], hkv=4)
    qkv = torch.stack((q, k, v), 1)
    _no_breaks(lambda qkv, cu: rocmflash.flash_attn_varlen_qkvpacked_func(qkv, cu, 7, causal=True), qkv, cu_q)
    _no_breaks(lambda q, k, v, a, b: fa3.flash_attn_varlen_func(q, k, v, a, b, 7, 7), q, k, v, cu_q, cu_k)
    qd, kc, vc, kn, vn, kw = _kv_inputs(11, {})
    _no_breaks(lambda *a: fa3.flash_attn_with_kvcache(*a, cache_seqlens=kw["cache_seqlens"], causal=True), qd, kc,
               vc, kn, vn)


# ----------------------------------------------------------------------------- kvcache
B, HKV, GROUP, D, CAP = 2, 2, 2, 32, 48


def _cache(seed, paged=False, page=16):
    """(k_cache, v_cache, block_table): random where filled; unpaged (B, CAP, Hkv, D) or shuffled pages."""
    gen = torch.Generator().manual_seed(seed)
    if paged:
        blocks = B * (CAP // page) + 1
        kc, vc = (torch.randn(blocks, page, HKV, D, generator=gen).half() for _ in range(2))
        table = torch.randperm(blocks, generator=gen)[:B * (CAP // page)].view(B, -1).to(torch.int32)
        return kc, vc, table
    kc, vc = (torch.randn(B, CAP, HKV, D, generator=gen).half() for _ in range(2))
    return kc, vc, None


def _rows(cache, table, b, n, page=16):
    if table is None:
        return cache[b, :n]
    idx = torch.arange(n)
    return cache[table[b][idx // page].long(), idx % page]


CASES = {
    "append": {},
    "append-paged": {"paged": True},
    "append-leftpad": {"leftpad": True},
    "append-int-length": {"int_length": True},
    "append-rotary": {"rotary": True},
    "append-batch-idx": {"batch_idx": True},
    "no-append": {"append": False},
}


def _kv_inputs(seed, case):
    gen = torch.Generator().manual_seed(seed + 100)
    kc, vc, table = _cache(seed, case.get("paged", False))
    q = torch.randn(B, 1, HKV * GROUP, D, generator=gen).half()
    kn, vn = (torch.randn(B, 1, HKV, D, generator=gen).half() for _ in range(2)) if case.get("append", True) \
        else (None, None)
    lens = 17 if case.get("int_length") else torch.tensor([5, 23], dtype=torch.int32)
    kw = {"cache_seqlens": lens, "block_table": table}
    if case.get("leftpad"):
        kw["cache_leftpad"] = torch.tensor([2, 0], dtype=torch.int32)
    if case.get("rotary"):
        half = 8
        angles = torch.arange(CAP)[:, None] * torch.rand(half, generator=gen)[None, :]
        kw.update(rotary_cos=angles.cos(), rotary_sin=angles.sin())
    if case.get("batch_idx"):
        kw["cache_batch_idx"] = torch.tensor([1, 0], dtype=torch.int32)
    return q, kc, vc, kn, vn, kw


def _decode_step(q, kc, vc, kn, vn, kw):
    out, lse = rocmflash.flash_attn_with_kvcache(q, kc, vc, kn, vn, causal=True, return_softmax_lse=True, **kw)
    return out + 1, lse


@pytest.mark.parametrize("name", list(CASES))
def test_kvcache_traces_whole_and_matches_eager(name, poisoned):
    """One graph with one decode op; out, LSE and the appended caches equal the eager call's."""
    case = CASES[name]
    q, kc, vc, kn, vn, kw = _kv_inputs(3, case)
    graphs = Graphs()
    kc_c, vc_c = kc.clone(), vc.clone()
    out, lse = torch.compile(_decode_step, fullgraph=True, backend=graphs)(q, kc_c, vc_c, kn, vn, kw)
    op = "kvcache_append_fwd" if kn is not None else "kvcache_fwd"
    assert len(graphs.graphs) == 1 and any(f"rocmflash.{op}" in t for t in graphs.targets()), graphs.targets()
    eager_out, eager_lse = _decode_step(q, kc, vc, kn, vn, kw)
    assert torch.isfinite(out).all() and torch.equal(out, eager_out) and torch.equal(lse, eager_lse)
    assert graphs.traced_outputs(op) == [(tuple(t.shape), t.stride(), t.dtype) for t in (out, lse)]
    assert lse.shape == (B, HKV * GROUP, 1) and lse.dtype == torch.float32
    assert torch.equal(kc_c, kc) and torch.equal(vc_c, vc)  # the compiled append wrote what the eager one wrote
    fresh_k, fresh_v, _ = _cache(3, case.get("paged", False))
    assert torch.equal(kc, fresh_k) != (kn is not None)  # (and it wrote something when it appended)


def test_kvcache_append_against_fp64_and_read_after_in_graph():
    """The compiled append + attention against fp64 over the cache's first ``len + 1`` keys; reads of the caches
    in the same graph see the old rows before the op and the appended ones after it."""
    q, kc, vc, kn, vn, kw = _kv_inputs(5, {"paged": True})
    lens, table = kw["cache_seqlens"], kw["block_table"]
    before_k = kc.clone()

    def step(q, kc, vc, kn, vn, lens, table):
        rows = (table[torch.arange(B), lens // 16].long(), lens % 16)  # where each new key goes
        old = kc[rows] * 1
        out = rocmflash.flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=lens, block_table=table,
                                                causal=True)
        return out, old, kc[rows] * 1, vc[rows] * 1

    rows = (table[torch.arange(B), lens // 16].long(), lens % 16)
    out, old, k_rows, v_rows = torch.compile(step, fullgraph=True, backend="aot_eager")(q, kc, vc, kn, vn, lens,
                                                                                         table)
    assert torch.equal(old, before_k[rows]) and not torch.equal(old, kn[:, 0])
    assert torch.equal(k_rows, kn[:, 0]) and torch.equal(v_rows, vn[:, 0])
    for b, n in enumerate(lens.tolist()):
        keys, vals = _rows(kc, table, b, n + 1), _rows(vc, table, b, n + 1)
        assert torch.equal(keys[:n], _rows(before_k, table, b, n))  # earlier rows untouched
        ref, _ = attention_fp64(q[b], keys, vals, 1 / math.sqrt(D), True)
        assert rel_err(out[b], ref) < TOL


def test_kvcache_values_checked_at_run_time_under_compile():
    """A length past the cache: the kernels' error word (read after the call on the CPU) or, with
    ``check_values=True``, the host check's message, from the compiled call; nothing stored for that sequence."""
    q, kc, vc, kn, vn, kw = _kv_inputs(7, {})
    bad = torch.tensor([5, CAP], dtype=torch.int32)  # no room for the new key of sequence 1
    fn = torch.compile(lambda *a, **kw: rocmflash.flash_attn_with_kvcache(*a, **kw), fullgraph=True,
                       backend="aot_eager")
    before = kc.clone()
    with pytest.raises(ValueError, match=r"cache_seqlens\[1\]=48 plus 1 new key\(s\) is outside the cache"):
        fn(q, kc, vc, kn, vn, cache_seqlens=bad, check_values=True)
    assert torch.equal(kc, before)  # the host check raised before anything was written
    fn(q, kc, vc, kn, vn, cache_seqlens=bad)
    assert torch.equal(kc[1], before[1])
    with pytest.raises(ValueError, match="cache_seqlens plus the new keys outside the cache"):
        rocmflash.check_errors()  # (on the CPU the next decode call would raise it too)


def test_kvcache_opcheck_and_fake_layouts():
    """Schemas (k_cache/v_cache declared mutated by the append op only), fakes and layouts: a transposed q keeps
    its memory order in ``out``; the LSE is (B, Hq, Sq) fp32 or the (0,) placeholder."""
    q, kc, vc, kn, vn, kw = _kv_inputs(9, {})
    lens = kw["cache_seqlens"]
    tail = (None, None, None, None, None, None, True, -1, -1, 0.0, 0)
    torch.library.opcheck(torch.ops.rocmflash.kvcache_append_fwd.default,
                          (q, kc, vc, kn, vn, lens) + tail + (True, False))
    torch.library.opcheck(torch.ops.rocmflash.kvcache_fwd.default,
                          (q, kc, vc, None, None, lens) + tail + (False, False))
    schema = torch.ops.rocmflash.kvcache_append_fwd.default._schema
    assert [a.name for a in schema.arguments if a.alias_info and a.alias_info.is_write] == ["k_cache", "v_cache"]
    assert not any(a.alias_info for a in torch.ops.rocmflash.kvcache_fwd.default._schema.arguments)
    qt = torch.randn(B, HKV * GROUP, 3, D).half().transpose(1, 2)  # (B, Sq, Hq, D) view of (B, Hq, Sq, D) memory
    for want_lse in (True, False):
        args = (qt, kc, vc, None, None, lens) + tail + (want_lse, False)
        real = torch.ops.rocmflash.kvcache_fwd(*args)
        with FakeTensorMode(allow_non_fake_inputs=False) as mode:
            fake = torch.ops.rocmflash.kvcache_fwd(*(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a
                                                     for a in args))
        for r, f in zip(real, fake):
            assert (r.shape, r.stride(), r.dtype) == (f.shape, f.stride(), f.dtype)
        assert real[0].stride() == qt.stride()
        assert real[1].shape == ((B, HKV * GROUP, 3) if want_lse else (0,))


# ----------------------------------------------------------------------------- attention sinks under compile
def test_varlen_sinks_trace_whole_forward_backward_equal_eager():
    """``s_aux`` reaches the traced op (never dropped): out, LSE and every gradient, the sinks' included, equal the
    eager call's; the sinks change the answer (against the same call without them)."""
    q, k, v, cu_q, cu_k = _packed([5, 1, 12], [7, 3, 12], seed=4, grad=True)
    sinks = torch.randn(4, generator=torch.Generator().manual_seed(5)).requires_grad_()
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(6)).half()

    def step(q, k, v, cu_q, cu_k, s):
        return rocmflash.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 12, 12, causal=True, return_lse=True, s_aux=s)

    def run(fn, s):
        out, lse = fn(q, k, v, cu_q, cu_k, s)
        leaves = (q, k, v) + ((s,) if s is not None else ())
        return (out, lse) + torch.autograd.grad((out.float() * do).sum() + lse.sum(), leaves)

    graphs = Graphs()
    compiled = run(torch.compile(step, fullgraph=True, backend=graphs), sinks)
    assert len(graphs.graphs) == 1 and any("rocmflash.varlen_fwd" in t for t in graphs.targets())
    eager = run(step, sinks)
    for name, c, e in zip(("out", "lse", "dq", "dk", "dv", "dsinks"), compiled, eager):
        assert torch.isfinite(c).all() and torch.equal(c, e), name
    assert not torch.equal(compiled[0], run(step, None)[0])


def test_kvcache_sinks_reach_the_traced_op():
    """``s_aux`` of ``flash_attn_with_kvcache`` under compile: out and LSE equal the eager call's with sinks, and
    differ from the call without them; the op's schema carries it."""
    q, kc, vc, kn, vn, kw = _kv_inputs(7, CASES["append"])
    sinks = torch.randn(HKV * GROUP, generator=torch.Generator().manual_seed(8))
    kw = dict(kw, s_aux=sinks)
    kc_c, vc_c = kc.clone(), vc.clone()
    out, lse = torch.compile(_decode_step, fullgraph=True, backend="aot_eager")(q, kc_c, vc_c, kn, vn, kw)
    eager_out, eager_lse = _decode_step(q, kc, vc, kn, vn, kw)
    assert torch.equal(out, eager_out) and torch.equal(lse, eager_lse)
    kc2, vc2, _ = _cache(7)
    plain_out, _ = _decode_step(q, kc2, vc2, kn, vn, {k: v for k, v in kw.items() if k != "s_aux"})
    assert not torch.equal(out, plain_out)
    assert "s_aux" in str(torch.ops.rocmflash.kvcache_append_fwd.default._schema)
