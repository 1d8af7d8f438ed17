"""Per-device error words: how a kernel reports a value it had to clamp without the host reading it.

A default call never waits for the GPU, so the *values* of the tensors it is handed (cumulative
lengths, cache lengths, page numbers, descales) are checked by the kernels, which keep every address
inside its tensor and OR a bit into an int32 word, one per device and per kernel family
(:class:`ErrorWord`). Three families use one: varlen (:mod:`rocmflash.kernels.varlen.checks`,
reported by :mod:`rocmflash.api.varlen`), decode (:mod:`rocmflash.kernels.decode.host`, reported by
:mod:`rocmflash.api.decode_errors`) and the fp8 forward (:mod:`rocmflash.kernels.fp8.errors`). Each
keeps only its bits and its :class:`Report` (what each bit says); the word and its host side are here:

* :meth:`ErrorWord.read_and_report` -- read the word now (a wait on a GPU), clear it and raise: what a
  family's ``check_errors(device)`` does for each device (:func:`rocmflash.check_errors`: every family's).
* :meth:`ErrorWord.poll` -- on a GPU, look at the last *finished* asynchronous copy of the word (pinned
  host memory and an event: no wait) and start a copy every ``every`` calls; neither while a CUDA graph
  is captured. On the CPU (Triton's interpreter) there is no GPU to wait for: the family says whether
  its poll reads the word at once.

Both clear the word as they read it, in one device operation (:func:`rocmflash.kernels.error_swap.swap`,
an atomic exchange into a snapshot buffer that the host then reads): a bit that a kernel queued after
the read sets stays in the word for the next report, where a read and a later ``zero_()`` lost it.

The raised ``ValueError`` reads ``"<api> on <device>: <how> got <what each set bit means><tail>"``.
"""

from __future__ import annotations

from typing import NamedTuple, TYPE_CHECKING

from rocmflash.kernels.error_swap import swap
from rocmflash.kernels.launch import on_device

if TYPE_CHECKING:  # annotations only: torch is imported where a launch needs it
    import torch


class Report(NamedTuple):
    """What a family's error bits mean: ``"<api> on <device>: <how> got <texts of set bits>; ...<tail>"``."""

    api: str  #: the call named first, e.g. ``"flash_attn_varlen_func"``
    texts: tuple  #: ``((mask, text), ...)`` in message order; a text is named when ``bits & mask``
    tail: str  #: what follows the list (what was clamped, how to get a host check)

    def message(self, bits: int, device, how: str) -> str:
        what = "; ".join(text for mask, text in self.texts if bits & mask) or f"error bits {bits:#x}"
        return f"{self.api} on {device}: {how} got {what}{self.tail}"


class Watch:
    """One device's watch on its error word: calls since the last copy started, the event that completes the
    copy in flight (None: none), the pinned host buffer the copy writes (made at the first copy), and the
    device buffer the word's bits are exchanged into (:func:`~rocmflash.kernels.error_swap.swap`; made at the
    first read). Bits in a copy in flight are no longer in the word: they are reported from ``host``."""

    __slots__ = ("calls", "event", "host", "snapshot")

    def __init__(self):
        self.calls, self.event, self.host, self.snapshot = 0, None, None, None


def capturing(device) -> bool:
    """Whether ``device`` is a GPU whose current stream is being captured into a CUDA graph (no event query
    and no copy to record then)."""
    import torch

    return device.type == "cuda" and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def device_key(device) -> torch.device:
    """``device`` as the words are keyed: a ``torch.device``, ``"cuda"`` with the current device's index."""
    import torch

    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


class ErrorWord:
    """One kernel family's int32 ``(1,)`` error word per device, and its host side.

    ``words`` (device -> tensor) and ``watches`` (device -> :class:`Watch`) are plain dicts: a family
    module exposes them under its historic names (``_ERROR_WORDS``, ``_WATCHES``)."""

    __slots__ = ("watches", "words")

    def __init__(self):
        self.words: dict = {}
        self.watches: dict = {}

    def word(self, device) -> torch.Tensor:
        """The word the family's kernels on ``device`` OR their bits into (zero until one met a bad value)."""
        import torch

        word = self.words.get(device)
        if word is None:
            word = self.words[device] = torch.zeros(1, dtype=torch.int32, device=device)
        return word

    def devices(self, device=None) -> list:
        """The devices a ``check_errors(device)`` reads: every one with a word for None, else ``device``'s key."""
        return list(self.words) if device is None else [device_key(device)]

    def watch(self, device) -> Watch:
        """``device``'s :class:`Watch` (made on first use)."""
        watch = self.watches.get(device)
        if watch is None:
            watch = self.watches[device] = Watch()
        return watch

    def take(self, device) -> torch.Tensor:
        """Exchange ``device``'s word for 0 in one device operation (queued, no wait); returns the snapshot
        buffer that then holds its bits. Never while a CUDA graph is captured: a replay would clear the word."""
        import torch

        word = self.word(device)
        watch = self.watch(device)
        if watch.snapshot is None:
            watch.snapshot = torch.zeros(1, dtype=torch.int32, device=word.device)
        with on_device(word):
            swap(word, watch.snapshot)
        return watch.snapshot

    def read_bits(self, device) -> int:
        """Every bit ``device``'s word and a copy of it in flight hold (a wait on a GPU), cleared from both."""
        watch = self.watches.get(device)
        bits = 0
        if watch is not None and watch.event is not None:
            watch.event.synchronize()  # the poll's copy took its bits out of the word: they are reported here
            watch.event = None
            bits = int(watch.host[0])
        word = self.words.get(device)
        # a look first: a clean word costs the one wait it always did and no launch (a bit set after the look
        # stays in the word); a set one is exchanged, which takes the bits seen and any set since, together
        if word is not None and int(word.item()):
            bits |= int(self.take(device).item())
        return bits

    def read_and_report(self, device, how: str, report: Report) -> None:
        """Read ``device``'s word (a wait on a GPU) and, when a bit is set, clear it and raise ``ValueError``."""
        bits = self.read_bits(device)
        if bits:
            raise ValueError(report.message(bits, device, how))

    def poll(self, device, report: Report, every: int, capturing=capturing, cpu_how=None) -> None:
        """Raise what an earlier, finished copy of ``device``'s word shows; start a copy every ``every`` calls.

        Never waits for a GPU. ``capturing(device)``: whether a graph is being captured (then nothing is
        queried, exchanged or copied; replays still set bits, seen after capture). On the CPU the word is
        read at once, reported as ``cpu_how``, when that is given; None leaves the CPU to the caller."""
        import torch

        if device.type != "cuda":
            if cpu_how is not None:
                self.read_and_report(device, cpu_how, report)
            return
        watch = self.watches.get(device)
        if watch is None:
            watch = self.watches[device] = Watch()
        watch.calls += 1
        if watch.event is None and watch.calls < every:  # the common case: nothing to do
            return
        if capturing(device):  # Event.query() is not permitted during capture, and a copy would be captured
            return
        if watch.event is not None:
            if not watch.event.query():
                return
            watch.event = None
            bits = int(watch.host[0])  # pinned host memory the finished copy wrote: no GPU wait
            if bits:  # (cleared from the word by the exchange the copy read: nothing to reset)
                raise ValueError(report.message(bits, device, "an earlier call"))
        if watch.calls >= every:
            watch.calls = 0
            snapshot = self.take(device)  # the word's bits, taken out of it: later kernels' bits stay in it
            if watch.host is None:
                watch.host = torch.zeros(1, dtype=torch.int32, pin_memory=True)
            with on_device(snapshot):
                watch.host.copy_(snapshot, non_blocking=True)
                watch.event = torch.cuda.Event()
                watch.event.record()


__all__ = ["ErrorWord", "Report", "Watch", "capturing", "device_key"]
