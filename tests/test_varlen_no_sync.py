"""The default ``flash_attn_varlen_func`` call reads nothing back from the device: the values of
``cu_seqlens`` are checked by the kernels, which clamp each sequence into the packed tensors (never an
address outside q, k, v, the output, the LSE or the gradients) and report through a per-device error
word -- raised by ``rocmflash.api.varlen.check_errors()``, by a later call and, on the CPU, by the call
itself. ``check_values=True`` keeps the synchronous host check. Triton's interpreter (CPU).

:func:`no_host_reads` is the CPU stand-in for ``torch.cuda.set_sync_debug_mode("error")``: every op that
would make the host wait for a GPU -- a tensor turned into a Python value (``item``, ``int``, ``bool``,
``tolist``, ``numpy``, ``cpu``), ``torch.equal``, and ops whose output size depends on values
(``nonzero``, boolean indexing, ``masked_select``, ``unique``, ``repeat_interleave`` without a size) --
raises, except inside a kernel launch (the interpreter reads its arguments where a GPU would not).
"""

import contextlib
import math
import re

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from varlen_reference import rel_err, varlen_fp64

aten = torch.ops.aten
#: ops whose result is a host value or whose output size depends on tensor values (a GPU sync each)
_SYNCING = {aten._local_scalar_dense.default, aten.equal.default, aten.nonzero.default,
            aten.masked_select.default, aten._unique2.default, aten.unique_dim.default,
            aten.unique_consecutive.default, aten.repeat_interleave.Tensor}


class HostRead(AssertionError):
    """A host read inside :func:`no_host_reads`."""


def _bool_index(args) -> bool:
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ())


class _NoHostReads(TorchDispatchMode):
    def __init__(self, allowed_ptrs, record=None):
        super().__init__()
        self.allowed, self.record = allowed_ptrs, record
        self.paused = 0

    def read(self, what: str) -> None:
        if self.record is None:
            raise HostRead(f"host read: {what}")
        self.record.append(what)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.paused:
            syncs = func in _SYNCING or (func in (aten.index.Tensor, aten.index_put_.default, aten.index_put.default)
                                         and _bool_index(args))
            if func is aten.repeat_interleave.Tensor and kwargs.get("output_size") is not None:
                syncs = False
            if syncs and not (args and isinstance(args[0], torch.Tensor) and args[0].data_ptr() in self.allowed()):
                self.read(str(func))
        return func(*args, **kwargs)


@contextlib.contextmanager
def no_host_reads(monkeypatch, allowed_ptrs=lambda: (), record=None):
    """Raise :class:`HostRead` on any host read in the block, outside kernel launches. ``allowed_ptrs()``:
    data pointers of tensors that may be read (the CPU's error word, read where no GPU exists).
    ``record``: a list to append each read's name to instead of raising."""
    from rocmflash.kernels import launch

    mode = _NoHostReads(allowed_ptrs, record)
    real_launch = launch.launch_kernel

    def launch_paused(*a, **kw):
        mode.paused += 1
        try:
            return real_launch(*a, **kw)
        finally:
            mode.paused -= 1

    def refuse(name):
        real = getattr(torch.Tensor, name)

        def method(self, *a, **kw):
            if not mode.paused and self.data_ptr() not in allowed_ptrs():
                mode.read(f"Tensor.{name}")
            return real(self, *a, **kw)
        return method

    with monkeypatch.context() as mp:
        mp.setattr(launch, "launch_kernel", launch_paused)
        for name in ("tolist", "numpy", "cpu", "__array__"):  # these never reach the dispatcher on the CPU
            mp.setattr(torch.Tensor, name, refuse(name))
        with mode:
            yield


def cpu_error_word():
    """The varlen and decode error words of the CPU: read by the call itself where there is no GPU to wait for."""
    from rocmflash.kernels.decode import host as KD
    from rocmflash.kernels.decode import checks as DC
    from rocmflash.kernels.varlen import checks as VC

    cpu = torch.device("cpu")
    return lambda: tuple(words[cpu].data_ptr() for words in (VC._ERROR_WORDS, DC._ERROR_WORDS) if cpu in words)


@pytest.fixture(autouse=True)
def _clean_error_words():
    from rocmflash.kernels.varlen import checks as VC

    import rocmflash.api.varlen_errors as V

    VC._ERROR_WORDS.clear()
    V._WATCHES.clear()
    yield
    VC._ERROR_WORDS.clear()
    V._WATCHES.clear()


def _packed(lens_q, lens_k, hq=4, hkv=2, d=32, seed=0, dtype=torch.bfloat16):
    gen = torch.Generator().manual_seed(seed)
    cu_q = torch.tensor([0] + torch.tensor(lens_q).cumsum(0).tolist(), dtype=torch.int32)
    cu_k = torch.tensor([0] + torch.tensor(lens_k).cumsum(0).tolist(), dtype=torch.int32)
    q = torch.randn(sum(lens_q), hq, d, generator=gen).to(dtype)
    k = torch.randn(sum(lens_k), hkv, d, generator=gen).to(dtype)
    v = torch.randn(sum(lens_k), hkv, d, generator=gen).to(dtype)
    return q, k, v, cu_q, cu_k


# ----------------------------------------------------------------------------- no host read
def test_the_spy_catches_each_kind_of_host_read(monkeypatch):
    """The spy itself: each way of reading a tensor on the host raises inside it (so a pass means something)."""
    t = torch.tensor([3, 1, 2])
    reads = [lambda: t[0].item(), lambda: int(t[0]), lambda: bool(t[0] > 1), lambda: t.tolist(),
             lambda: torch.equal(t, t), lambda: t.nonzero(), lambda: t[t > 1], lambda: max(t),
             lambda: f"{t[0]}", lambda: t.numpy(), lambda: t.cpu(), lambda: torch.repeat_interleave(t)]
    for read in reads:
        with pytest.raises(HostRead), no_host_reads(monkeypatch):
            read()
    with no_host_reads(monkeypatch):  # device-side work passes
        (t.cumsum(0) + t.argsort(stable=True)).max()


def test_default_call_forward_and_backward_read_nothing_on_the_host(interpret, monkeypatch):
    """Forward (with LSE) and backward of the default call, GQA, causal, a window: no host read except the
    CPU's error word (read at once only where there is no GPU to wait for); same answer as the fp64 reference."""
    from rocmflash import flash_attn_varlen_func

    lens_q, lens_k = [17, 0, 45], [20, 3, 45]
    q, k, v, cu_q, cu_k = _packed(lens_q, lens_k, seed=3)
    for t in (q, k, v):
        t.requires_grad_(True)
    with no_host_reads(monkeypatch, cpu_error_word()):
        out, lse = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 45, 45, causal=True, window_size=(16, -1),
                                          return_lse=True)
        out.float().square().sum().backward()
    ref, ref_lse = varlen_fp64(*(t.detach().double() for t in (q, k, v)), cu_q, cu_k, 1 / math.sqrt(32), True,
                               (16, -1), 0.0)
    assert rel_err(out, ref) < 2.5e-2
    assert torch.equal(torch.isfinite(lse), torch.isfinite(ref_lse))
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_check_values_true_reads_on_the_host(interpret, monkeypatch):
    """The spy sees the synchronous check's reads (what the default call did before this change)."""
    from rocmflash import flash_attn_varlen_func

    q, k, v, cu_q, cu_k = _packed([5, 7], [5, 9])
    with pytest.raises(HostRead), no_host_reads(monkeypatch, cpu_error_word()):
        flash_attn_varlen_func(q, k, v, cu_q, cu_k, 7, 9, check_values=True)


# ----------------------------------------------------------------------------- bad values: clamped, reported
G = 5  #: guard rows on each side of every packed tensor


def _guarded(t, fill):
    """``t``'s values in a view of a larger buffer whose ``G`` rows on each side hold ``fill``: ``(view, buf)``."""
    buf = torch.full((t.shape[0] + 2 * G, *t.shape[1:]), fill, dtype=t.dtype)
    view = buf[G:G + t.shape[0]]
    view.copy_(t)
    return view, buf


@pytest.fixture
def guarded_outputs(monkeypatch):
    """Every packed float buffer the call allocates with ``torch.empty_like`` (output, dq/dk/dv) and every
    ``(H, T)`` one ``torch.empty`` makes (the LSE) is a view into a buffer with ``G`` guard rows of 7.0 on
    each side (the LSE's: ``G * T`` values before head 0 and after the last); returns ``[(buffer, dim)]``."""
    made = []
    real_like, real_empty = torch.empty_like, torch.empty

    def like(t, *a, **kw):
        x = real_like(t, *a, **kw)
        if x.ndim == 3 and x.is_floating_point():
            view, buf = _guarded(x.fill_(7.0), 7.0)
            made.append((buf, 0))
            return view
        return x

    def empty(*shape, **kw):
        x = real_empty(*shape, **kw)
        if x.ndim == 2 and x.is_floating_point():  # guard rows before the first head and after the last:
            view, buf = _guarded(x.fill_(7.0), 7.0)  # the view stays contiguous, as the kernels' delta assumes
            made.append((buf, 0))
            return view
        return x

    monkeypatch.setattr(torch, "empty_like", like)
    monkeypatch.setattr(torch, "empty", empty)
    return made


def _guards_intact(buf, dim, fill):
    lo, hi = (buf[:G], buf[-G:]) if dim == 0 else (buf[:, :G], buf[:, -G:])
    return bool((lo == fill).all()) and bool((hi == fill).all())


BAD = [  # (which, entries of a 3-sequence cu over 12 q / 14 k rows, max_q, max_k, words)
    ("q", [0, 5, 3, 12], 7, 9, "non-decreasing"),
    ("q", [0, 5, 7, 40], 7, 9, "cu_seqlens_q[-1]"),
    ("q", [-9, 5, 7, 12], 7, 9, "start at 0"),
    ("q", [0, -2 ** 31, 2 ** 31 - 1, 12], 7, 9, "non-decreasing"),
    ("q", [0, 5, 12, 12], 6, 9, "max_seqlen_q"),
    ("k", [0, 9, 2, 14], 7, 9, "cu_seqlens_k must be non-decreasing"),
    ("k", [0, 5, 9, 2 ** 31 - 1], 7, 9, "cu_seqlens_k[-1]"),
    ("k", [3, 5, 9, 14], 7, 9, "cu_seqlens_k must start at 0"),
    ("k", [0, 1, 14, 14], 7, 9, "max_seqlen_k"),
]


@pytest.mark.parametrize("which,entries,max_q,max_k,words", BAD)
def test_bad_cu_seqlens_stay_inside_the_tensors_and_are_reported(interpret, monkeypatch, guarded_outputs, which,
                                                                 entries, max_q, max_k, words):
    """Inputs inside NaN guard rows (a read outside them would put NaN into a result), outputs and
    gradients inside guard rows of 7.0 (a write outside would change them): forward and backward with
    wrong values leave every guard untouched and produce no NaN; check_errors() names what was wrong.
    The CPU's immediate report is switched off here to run as on a GPU, where it comes later."""
    import rocmflash.api.varlen_errors as V
    from rocmflash import flash_attn_varlen_func

    real = V._read_and_report
    monkeypatch.setattr(V, "_read_and_report", lambda device, how: None)
    q, k, v, cu_q, cu_k = _packed([5, 2, 5], [5, 4, 5], seed=4)
    (q, qb), (k, kb), (v, vb) = (_guarded(t, float("nan")) for t in (q, k, v))
    bad = torch.tensor(entries, dtype=torch.int32)
    cu_q, cu_k = (bad, cu_k) if which == "q" else (cu_q, bad)
    for t in (q, k, v):
        t.requires_grad_(True)
    out, lse = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, causal=True, return_lse=True)
    (out.float().sum() + lse.masked_fill(lse == float("-inf"), 0).sum()).backward()
    for buf in (qb, kb, vb):
        assert torch.isnan(buf[:G]).all() and torch.isnan(buf[-G:]).all(), "wrote into an input's guard"
    assert len(guarded_outputs) >= 5  # out, LSE, dq, dk, dv (and delta)
    for buf, dim in guarded_outputs:
        assert _guards_intact(buf, dim, 7.0), "wrote outside an output or gradient"
        assert not torch.isnan(buf).any(), "read outside an input"
    monkeypatch.setattr(V, "_read_and_report", real)
    with pytest.raises(ValueError, match=re.escape(words)):
        V.check_errors()
    V.check_errors()  # reported once, then reset


def test_cpu_call_raises_at_once_and_check_values_true_names_the_index(interpret):
    """On the CPU the default call itself raises (nothing to wait for); check_values=True raises from the
    host check before any kernel runs, with the index, and leaves the error word alone."""
    from rocmflash import flash_attn_varlen_func
    from rocmflash.kernels import launch
    from rocmflash.kernels.varlen import checks as VC

    q, k, v, _, cu_k = _packed([5, 7], [5, 9])
    bad = torch.tensor([0, 13, 12], dtype=torch.int32)
    with pytest.raises(ValueError, match="this call got cu_seqlens_q must be non-decreasing; a sequence of "
                                         "cu_seqlens_q is longer than max_seqlen_q"):
        flash_attn_varlen_func(q, k, v, bad, cu_k, 7, 9)
    assert int(VC.error_word(torch.device("cpu"))) == 0  # reported and reset
    with launch.observe_launches() as seen, pytest.raises(ValueError, match=r"drops at index 2 \(13 -> 12\)"):
        flash_attn_varlen_func(q, k, v, bad, cu_k, 7, 9, check_values=True)
    assert seen == [] and int(VC.error_word(torch.device("cpu"))) == 0


def test_a_later_call_reports_an_earlier_bad_one(interpret, monkeypatch):
    """As on a GPU (the call's own report switched off): the next call raises before it launches anything,
    once; check_values=True also reports what an earlier unchecked call left."""
    import rocmflash.api.varlen_errors as V
    from rocmflash import flash_attn_varlen_func
    from rocmflash.kernels import launch

    q, k, v, cu_q, cu_k = _packed([5, 7], [5, 9])
    bad = torch.tensor([0, 5, 13], dtype=torch.int32)
    real = V._read_and_report
    monkeypatch.setattr(V, "_read_and_report", lambda device, how: None)
    flash_attn_varlen_func(q, k, v, bad, cu_k, 7, 9)  # no error yet
    monkeypatch.setattr(V, "_poll_errors", lambda device: real(device, "an earlier call"))
    with launch.observe_launches() as seen, pytest.raises(ValueError, match=r"an earlier call got cu_seqlens_q\[-1\]"):
        flash_attn_varlen_func(q, k, v, cu_q, cu_k, 7, 9)
    assert [s["kernel"] for s in seen] == ["_swap_word"]  # no attention kernel: only the word's read-and-clear
    flash_attn_varlen_func(q, k, v, cu_q, cu_k, 7, 9)  # reported once: the next call runs
    monkeypatch.setattr(V, "_read_and_report", lambda device, how: None)
    flash_attn_varlen_func(q, k, v, bad, cu_k, 7, 9)
    monkeypatch.setattr(V, "_read_and_report", real)
    with pytest.raises(ValueError, match="a call since the last check"):
        flash_attn_varlen_func(q, k, v, cu_q, cu_k, 7, 9, check_values=True)


def test_kernel_builds_do_not_specialise_on_packed_sizes():
    """Packed sizes change every call: the kernels leave them unspecialised (no new compile per size)."""
    from rocmflash.kernels.varlen import host as VK
    from rocmflash.kernels.varlen import checks as VC

    expected = {VK._varlen_fwd: {"TOTAL_Q", "TOTAL_K", "MAX_Q", "MAX_K", "STRICT_END", "stride_lh"},
                VK._varlen_bwd_dq: {"TOTAL_Q", "TOTAL_K", "stride_lh"},
                VK._varlen_bwd_dkdv: {"TOTAL_Q", "TOTAL_K", "stride_lh"},
                VC._check_lengths: {"TOTAL_Q", "TOTAL_K", "MAX_Q", "MAX_K", "BATCH"},
                VC._sanitise_lengths: {"TOTAL_Q", "TOTAL_K", "MAX_Q", "MAX_K", "BATCH"}}
    for fn, names in expected.items():
        flagged = {p.name for p in fn.params if p.do_not_specialize}
        assert flagged == names == set(fn.unspecialised), fn.__name__


# ----------------------------------------------------------------------------- on a GPU
@pytest.mark.gpu
def test_gpu_default_calls_never_synchronise_and_a_later_call_reports(compiled):
    """On the GPU, under torch.cuda.set_sync_debug_mode("error"): forward + backward calls (polls, the
    error word's copies and their event queries included) never synchronise; a bad call is reported by a
    later one, from a copy that completed on its own, within two poll periods."""
    import rocmflash.api.varlen_errors as V
    from rocmflash import flash_attn_varlen_func

    lens = [300, 1, 1200, 64]
    q, k, v, cu_q, cu_k = (t.cuda() for t in _packed(lens, lens, hq=16, hkv=4, d=128, seed=6))
    for t in (q, k, v):
        t.requires_grad_(True)

    def step(cu=cu_q):
        out = flash_attn_varlen_func(q, k, v, cu, cu_k, 1200, 1200, causal=True)
        out.float().square().sum().backward()

    step()  # compiles
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(2 * V.ERROR_POLL_CALLS + 2):
            step()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    bad = cu_q.clone()
    bad[2] = 5000  # past the 1565 packed rows
    with torch.no_grad():
        flash_attn_varlen_func(q, k, v, bad, cu_k, 1200, 1200, causal=True)
        torch.cuda.synchronize()
        with pytest.raises(ValueError, match="an earlier call got cu_seqlens_q"):
            for _ in range(2 * V.ERROR_POLL_CALLS + 1):
                flash_attn_varlen_func(q, k, v, cu_q, cu_k, 1200, 1200, causal=True)
    V.check_errors()  # reported once
