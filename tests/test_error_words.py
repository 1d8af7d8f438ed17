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
    import rocmflash.api.varlen as V
    from rocmflash.api import decode_errors as DE
    from rocmflash.kernels import fp8_errors as FE
    from rocmflash.kernels import kv_decode as KD
    from rocmflash.kernels import varlen_checks as VC

    varlen = Family("varlen", VC.ERRORS, V._poll_errors, V.check_errors, V.ERROR_POLL_CALLS,
                    VC.BAD_ORDER.value | (VC.BAD_LONG.value << VC.K_SHIFT.value),
                    "cu_seqlens_q must be non-decreasing; a sequence of cu_seqlens_k is longer than max_seqlen_k",
                    "flash_attn_varlen_func on cuda:0: ",
                    (" (clamped into the packed tensors, so no memory outside them was touched, but those sequences' "
                     "outputs are wrong); pass check_values=True to have each call checked on the host, with the "
                     "index and value"))
    decode = Family("decode", KD.ERRORS, DE._poll_errors, DE.check_errors, DE.ERROR_POLL_CALLS,
                    KD.BAD_PAGE.value | KD.BAD_DESCALE.value,
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
    from rocmflash.kernels import fp8_errors as FE
    from rocmflash.kernels import kv_decode as KD
    from rocmflash.kernels import varlen_checks as VC

    cpu = torch.device("cpu")
    for errors, words, error_word in ((VC.ERRORS, VC._ERROR_WORDS, VC.error_word),
                                      (KD.ERRORS, KD._ERROR_WORDS, KD.error_word),
                                      (FE.ERRORS, fp8._ERROR_WORDS, fp8.error_word)):
        assert isinstance(errors, EW.ErrorWord) and words is errors.words
        word = error_word(cpu)
        assert word.dtype == torch.int32 and tuple(word.shape) == (1,) and int(word) == 0
        assert error_word(cpu) is word and errors.words[cpu] is word
    assert len({id(VC.ERRORS), id(KD.ERRORS), id(FE.ERRORS)}) == 3  # one word per family and device


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
    import rocmflash.api.varlen as V
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
