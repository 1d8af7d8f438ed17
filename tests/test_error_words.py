"""The one device error-word mechanism (``rocmflash.kernels.error_words``) behind varlen, decode and the fp8 forward.

Each family keeps its bits and messages; the word per device, the poll (an asynchronous copy every N calls,
read only once its event completed, never while a CUDA graph is captured), ``check_errors`` and the reset
are one implementation. The GPU path is driven here on the CPU: the "GPU" word is a CPU tensor under the
key ``cuda:0`` and ``torch.cuda.Event`` a fake whose completion the test decides; :func:`no_host_reads`
(``test_varlen_no_sync``) proves the poll never reads the word itself, only the finished copy.
"""

from collections.abc import Callable
from typing import NamedTuple

import pytest
import torch
from test_varlen_no_sync import HostRead, no_host_reads
from torch.utils._python_dispatch import TorchDispatchMode

DEV = torch.device("cuda", 0)


class Family(NamedTuple):
    name: str
    errors: object  #: its error_words.ErrorWord
    poll: Callable  #: poll(device), what each call runs
    check: Callable  #: its public check_errors(device=None)
    every: int  #: ERROR_POLL_CALLS
    bits: int  #: some of its bits
    what: str  #: what those bits say
    head: str  #: the message before "<how> got"
    tail: str  #: the message after what the bits say


def _families():
    """Each family's :class:`Family`, by name."""
    import rocmflash.api.varlen_errors as V
    from rocmflash.api import decode_errors as DE
    from rocmflash.kernels.fp8 import errors as FE
    from rocmflash.kernels.decode import host as KD
    from rocmflash.kernels.decode import checks as DC
    from rocmflash.kernels.varlen import checks as VC

    varlen = Family("varlen", VC.ERRORS, V._poll_errors, V.check_errors, V.ERROR_POLL_CALLS,
                    VC.BAD_ORDER.value | (VC.BAD_LONG.value << VC.K_SHIFT.value),
                    "cu_seqlens_q must be non-decreasing; a sequence of cu_seqlens_k is longer than max_seqlen_k",
                    "flash_attn_varlen_func on cuda:0: ",
                    (" (clamped into the packed tensors, so no memory outside them was touched, but those sequences' "
                     "outputs are wrong); pass check_values=True to have each call checked on the host, with the "
                     "index and value"))
    decode = Family("decode", DC.ERRORS, DE._poll_errors, DE.check_errors, DE.ERROR_POLL_CALLS,
                    DC.BAD_PAGE.value | DC.BAD_DESCALE.value,
                    ("block_table pointing outside the cache's pages; a k_descale/v_descale not finite and > 0 "
                     "(that call appended nothing)"),
                    "flash_attn_with_kvcache on cuda:0: ",
                    (" (those sequences' outputs are undefined; no other sequence's rows, no unused page and no "
                     "memory outside the cache were written); pass check_values=True to have each call checked on "
                     "the host, with the index and value"))
    fp8 = Family("fp8", FE.ERRORS, FE.poll_errors, FE.check_errors, FE.ERROR_POLL_CALLS, FE.BAD_DESCALE,
                 "a non-finite q_descale * k_descale * softmax_scale or v_descale (NaN or inf) for some (batch, kv_head)",
                 "fp8 attention on cuda:0: ", "; those rows of its output are not finite")
    return {f.name: f for f in (varlen, decode, fp8)}


FAMILIES = ["varlen", "decode", "fp8"]


@pytest.fixture(autouse=True)
def _clean():
    families = _families().values()
    for f in families:
        f.errors.words.clear()
        f.errors.watches.clear()
    yield
    for f in families:
        f.errors.words.clear()
        f.errors.watches.clear()


MADE: list = []  #: every FakeEvent made, in order


class FakeEvent:
    """``torch.cuda.Event`` stand-in: ``query()`` answers what the test set in ``done``."""

    def __init__(self):
        self.done, self.recorded = False, False
        MADE.append(self)

    def record(self):
        self.recorded = True

    def query(self):
        return self.done

    def synchronize(self):  # check_errors waits for a copy in flight: it has completed after this
        self.done = True


class CapturingEvent:
    def query(self):
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing")


def _gpu_word(errors, bits=0, host_bits=0, event=None):
    """A "GPU" word (a CPU tensor keyed cuda:0) and its watch, with an unpinned host buffer (no CUDA here)."""
    from rocmflash.kernels import error_words as EW

    word = errors.words[DEV] = torch.tensor([bits], dtype=torch.int32)
    watch = errors.watches[DEV] = EW.Watch()
    watch.host, watch.event = torch.tensor([host_bits], dtype=torch.int32), event
    return word, watch


def test_every_family_keeps_its_word_in_the_one_mechanism():
    from rocmflash.api import fp8
    from rocmflash.kernels import error_words as EW
    from rocmflash.kernels.fp8 import errors as FE
    from rocmflash.kernels.decode import host as KD
    from rocmflash.kernels.decode import checks as DC
    from rocmflash.kernels.varlen import checks as VC

    cpu = torch.device("cpu")
    for errors, words, error_word in ((VC.ERRORS, VC._ERROR_WORDS, VC.error_word),
                                      (DC.ERRORS, DC._ERROR_WORDS, DC.error_word),
                                      (FE.ERRORS, fp8._ERROR_WORDS, fp8.error_word)):
        assert isinstance(errors, EW.ErrorWord) and words is errors.words
        word = error_word(cpu)
        assert word.dtype == torch.int32 and tuple(word.shape) == (1,) and int(word) == 0
        assert error_word(cpu) is word and errors.words[cpu] is word
    assert len({id(VC.ERRORS), id(DC.ERRORS), id(FE.ERRORS)}) == 3  # one word per family and device


@pytest.mark.parametrize("family", FAMILIES)
def test_gpu_poll_copies_every_n_calls_reads_only_finished_copies_and_reports_once(family, monkeypatch):
    f = _families()[family]
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    word, watch = _gpu_word(f.errors, bits=f.bits)  # a kernel set bits before the first copy
    with no_host_reads(monkeypatch, allowed_ptrs=lambda: (watch.host.data_ptr(),)):
        for _ in range(f.every - 1):
            f.poll(DEV)
        assert watch.event is None and int(watch.host) == 0  # no copy yet
        f.poll(DEV)  # the N-th call starts one
        event = watch.event
        assert isinstance(event, FakeEvent) and event.recorded and watch.calls == 0 and int(watch.host) == f.bits
        for _ in range(3):
            f.poll(DEV)  # the copy has not completed: nothing is read, nothing raised, no second copy
        assert watch.event is event
        event.done = True
        with pytest.raises(ValueError) as info:
            f.poll(DEV)
        assert str(info.value) == f.head + "an earlier call got " + f.what + f.tail
    assert int(word) == 0 and watch.event is None  # reset (read outside the spy: the test's own look)
    with no_host_reads(monkeypatch, allowed_ptrs=lambda: (watch.host.data_ptr(),)):
        for _ in range(f.every + 2):  # reported once: the next copy shows nothing
            MADE[-1].done = True
            f.poll(DEV)
    with pytest.raises(HostRead), no_host_reads(monkeypatch, allowed_ptrs=lambda: (watch.host.data_ptr(),)):
        f.check(DEV)  # the explicit check does read the word (it waits on a GPU): the spy sees it


@pytest.mark.parametrize("family", FAMILIES)
def test_check_errors_reads_now_resets_and_names_the_bits(family):
    f = _families()[family]
    word, _ = _gpu_word(f.errors, bits=f.bits)
    with pytest.raises(ValueError) as info:
        f.check()
    assert str(info.value) == f.head + "a call since the last check got " + f.what + f.tail
    assert int(word) == 0
    f.check()
    f.check(DEV)


@pytest.mark.parametrize("family", FAMILIES)
def test_check_errors_of_cuda_without_an_index_reads_the_current_device(family, monkeypatch):
    """``check_errors("cuda")`` is the current GPU's word (decode and fp8 used to look up a key no word has)."""
    f = _families()[family]
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    _gpu_word(f.errors, bits=f.bits)
    with pytest.raises(ValueError, match="a call since the last check got"):
        f.check("cuda")


@pytest.mark.parametrize("family", FAMILIES)
def test_a_copy_in_flight_is_dropped_by_check_errors(family, monkeypatch):
    """An error read by check_errors is not reported a second time by the copy that was in flight then."""
    f = _families()[family]
    event = FakeEvent()
    event.done = True
    _gpu_word(f.errors, bits=f.bits, host_bits=f.bits, event=event)
    with pytest.raises(ValueError, match="a call since the last check got"):
        f.check(DEV)
    f.poll(DEV)  # the stale copy shows the same bits: not an error any more


@pytest.mark.parametrize("family", FAMILIES)
def test_no_event_query_and_no_copy_while_a_graph_is_captured(family, monkeypatch):
    """``Event.query()`` is not permitted during capture (the H100 fp8 benchmark hit it in decode): every family's
    poll leaves a pending copy alone and starts none until capture ends."""
    import rocmflash.api.varlen_errors as V
    from rocmflash.api import decode_errors as DE
    from rocmflash.kernels import error_words as EW

    f = _families()[family]
    for module, attr in ((EW, "capturing"), (V, "_capturing"), (DE, "_capturing")):
        monkeypatch.setattr(module, attr, lambda device: True)
    pending = CapturingEvent()
    _, watch = _gpu_word(f.errors, bits=f.bits, event=pending)
    for _ in range(f.every + 1):
        f.poll(DEV)
    assert watch.event is pending


@pytest.mark.parametrize("family, raises", [("varlen", None), ("decode", "an earlier call"), ("fp8", "this call")])
def test_cpu_poll_reads_the_word_where_the_family_says(family, raises):
    """On the CPU there is no GPU to wait for: decode's poll (before its launch) reports an earlier call, the fp8
    forward's (after its launch) this call; varlen's leaves it to the call, which reads right after its launch."""
    f = _families()[family]
    cpu = torch.device("cpu")
    word = f.errors.word(cpu)
    word.fill_(f.bits)
    if raises is None:
        f.poll(cpu)
        assert int(word) == f.bits
    else:
        with pytest.raises(ValueError) as info:
            f.poll(cpu)
        assert str(info.value) == f.head.replace("cuda:0", "cpu") + f"{raises} got " + f.what + f.tail
        assert int(word) == 0


# ----------------------------------------------------------------------------- read and clear in one device op
def _message(family: str, bits: int, device, how: str) -> str:
    """What ``family``'s Report says of ``bits`` (the families' texts are checked whole above)."""
    import rocmflash.api.varlen_errors as V
    from rocmflash.api import decode_errors as DE
    from rocmflash.kernels.fp8 import errors as FE

    return {"varlen": V._REPORT, "decode": DE._REPORT, "fp8": FE._REPORT}[family].message(bits, device, how)


def _two_bits(bits: int) -> tuple:
    """``bits`` as two disjoint non-zero parts: its lowest bit and the rest (both the one bit when it is alone)."""
    low = bits & -bits
    return low, (bits & ~low) or low


@pytest.mark.parametrize("interpreted", [True, False])
def test_swap_moves_the_word_into_the_snapshot_and_leaves_zero(interpreted, monkeypatch):
    """One atomic exchange (a kernel; under the interpreter on CPU tensors), or on a CPU word without the
    interpreter two torch ops that nothing can come between."""
    from rocmflash.kernels import launch as L
    from rocmflash.kernels.error_swap import swap

    if interpreted:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    else:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    value = int(torch.randint(1, 2**31 - 1, (1,)))
    word = torch.tensor([value], dtype=torch.int32)
    snapshot = torch.tensor([-1], dtype=torch.int32)  # poisoned
    with L.observe_launches() as seen:
        swap(word, snapshot)
    assert int(snapshot) == value and int(word) == 0
    assert [s["kernel"] for s in seen] == (["_swap_word"] if interpreted else [])


@pytest.mark.parametrize("family", FAMILIES)
def test_a_bit_set_after_the_poll_took_the_word_is_reported_by_the_next_read(family, monkeypatch, interpret):
    """The poll's copy is of the word's bits exchanged out of it: a kernel queued after the copy sets its bit in
    the word, which the report of the copy leaves alone (it used to ``zero_()`` the word then: that bit was lost)."""
    f = _families()[family]
    first, second = _two_bits(f.bits)
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    word, watch = _gpu_word(f.errors, bits=first)
    for _ in range(f.every):
        f.poll(DEV)  # the N-th call exchanges the word and starts the copy of what it held
    assert int(word) == 0 and int(watch.host) == first and watch.event is MADE[-1]
    word.bitwise_or_(second)  # a kernel queued after the copy
    MADE[-1].done = True
    with pytest.raises(ValueError) as earlier:
        f.poll(DEV)
    assert str(earlier.value) == _message(family, first, DEV, "an earlier call")
    assert int(word) == second  # kept for the next report
    with pytest.raises(ValueError) as later:
        f.check(DEV)
    assert str(later.value) == _message(family, second, DEV, "a call since the last check")
    assert int(word) == 0
    f.check(DEV)  # each reported once


@pytest.mark.parametrize("family", FAMILIES)
def test_check_errors_reports_what_a_copy_in_flight_took_from_the_word(family, monkeypatch, interpret):
    """A copy the poll started holds bits no longer in the word: check_errors waits for it and reports them with
    the word's own, once (the copy is then dropped: the next poll reports nothing)."""
    f = _families()[family]
    first, second = _two_bits(f.bits)
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    word, watch = _gpu_word(f.errors, bits=first)
    for _ in range(f.every):
        f.poll(DEV)
    event = MADE[-1]
    assert not event.done and int(word) == 0
    word.bitwise_or_(second)
    with pytest.raises(ValueError) as info:
        f.check(DEV)
    assert event.done and watch.event is None  # waited for, then dropped
    assert str(info.value) == f.head + "a call since the last check got " + f.what + f.tail  # f.bits = both
    assert int(word) == 0
    for _ in range(f.every + 1):
        f.poll(DEV)  # the dropped copy is not reported again; the next one shows nothing
        if MADE[-1] is not event:
            MADE[-1].done = True


class _KernelBetweenReads(TorchDispatchMode):
    """After the host's first read of a value (outside kernel launches), OR ``bits`` into ``word``: what a
    kernel queued earlier does on a GPU while the host reads the word, before it can clear it."""

    def __init__(self, word, bits):
        super().__init__()
        self.word, self.bits, self.fired, self.paused = word, bits, False, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten._local_scalar_dense.default and not self.fired and not self.paused:
            self.fired = True
            self.word.bitwise_or_(self.bits)
        return out


@pytest.mark.parametrize("family", ["varlen", "decode"])  # (fp8 has one bit: the two reports would be one text)
def test_a_bit_set_between_the_read_and_the_clear_is_not_lost(family, monkeypatch, interpret):
    """check_errors reads the word and clears it in one exchange: a bit a kernel sets right after the host's read
    is in the exchange (or, if later, in the word), never cleared unread -- a read and ``zero_()`` lost it."""
    from rocmflash.kernels import launch as L

    f = _families()[family]
    first, second = _two_bits(f.bits)
    assert first != second
    word, _ = _gpu_word(f.errors, bits=first)
    mode = _KernelBetweenReads(word, second)
    real_launch = L.launch_kernel

    def launch_paused(*a, **kw):  # the interpreter's own reads are the kernel's, not the host's
        mode.paused += 1
        try:
            return real_launch(*a, **kw)
        finally:
            mode.paused -= 1

    monkeypatch.setattr(L, "launch_kernel", launch_paused)
    reported = []
    with mode:
        for _ in range(3):
            try:
                f.check(DEV)
            except ValueError as err:
                reported.append(str(err))
    assert mode.fired and int(word) == 0
    assert reported == [f.head + "a call since the last check got " + f.what + f.tail]  # both bits, one report


# ----------------------------------------------------------------------------- rocmflash.check_errors
def _set_every_family(device):
    """Each family's bits set directly in its word on ``device`` (as its kernels would); the Families."""
    families = _families()
    for f in families.values():
        f.errors.word(device).fill_(f.bits)
    return families


def test_one_check_errors_reports_every_family_and_clears_them(interpret):
    import rocmflash

    assert "check_errors" in rocmflash.__all__
    cpu = torch.device("cpu")
    families = _set_every_family(cpu)
    _gpu_word(families["decode"].errors, bits=families["decode"].bits)  # and one on a second device
    with pytest.raises(ValueError) as info:
        rocmflash.check_errors()
    how = "a call since the last check got "
    parts = [f.head.replace("cuda:0", "cpu") + how + f.what + f.tail for f in families.values()]
    parts.insert(2, families["decode"].head + how + families["decode"].what + families["decode"].tail)
    assert str(info.value) == "4 device-side error reports: " + " | ".join(parts)
    assert "\n" not in str(info.value)
    for f in families.values():
        assert all(int(w) == 0 for w in f.errors.words.values())
    rocmflash.check_errors()  # cleared: silent
    rocmflash.check_errors("cpu")


def test_one_check_errors_of_one_device_and_one_family(interpret):
    """``device`` reads that device's words only; one report alone is the family's own message, unchanged."""
    import rocmflash

    cpu = torch.device("cpu")
    families = _families()
    varlen = families["varlen"]
    _gpu_word(varlen.errors, bits=varlen.bits)
    families["fp8"].errors.word(cpu).fill_(families["fp8"].bits)
    with pytest.raises(ValueError) as info:
        rocmflash.check_errors(DEV)
    assert str(info.value) == varlen.head + "a call since the last check got " + varlen.what + varlen.tail
    assert int(families["fp8"].errors.words[cpu]) == families["fp8"].bits  # another device: untouched
    with pytest.raises(ValueError, match="^fp8 attention on cpu: "):
        rocmflash.check_errors()


@pytest.mark.parametrize("family", FAMILIES)
def test_the_family_check_errors_still_report_their_own_family_only(family, interpret):
    cpu = torch.device("cpu")
    families = _set_every_family(cpu)
    f = families[family]
    with pytest.raises(ValueError) as info:
        f.check()
    assert str(info.value) == f.head.replace("cuda:0", "cpu") + "a call since the last check got " + f.what + f.tail
    for other in families.values():
        assert int(other.errors.words[cpu]) == (0 if other is f else other.bits)


# ----------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.usefixtures("compiled")
@pytest.mark.parametrize("family", FAMILIES)
def test_on_a_gpu_a_bit_set_after_the_poll_copy_is_reported_next(family):
    """The real path: the exchange kernel, the pinned copy and its event, a bit set by work queued after them."""
    import rocmflash

    f = _families()[family]
    first, second = _two_bits(f.bits)
    dev = torch.device("cuda", torch.cuda.current_device())
    word = f.errors.word(dev)
    word.fill_(first)
    for _ in range(f.every):
        f.poll(dev)  # the N-th call exchanges the word and starts the copy
    word.bitwise_or_(second)  # queued after the copy, on the same stream
    torch.cuda.synchronize()
    with pytest.raises(ValueError, match="an earlier call got"):
        f.poll(dev)
    with pytest.raises(ValueError, match="a call since the last check got"):
        rocmflash.check_errors(dev)
    assert int(word) == 0
    rocmflash.check_errors()
    f.check(dev)
