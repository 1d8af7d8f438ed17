"""Per-device error words: how a kernel reports a value it had to clamp without the host reading it.

A default call never waits for the GPU, so the *values* of the tensors it is handed (cumulative
lengths, cache lengths, page numbers, descales) are checked by the kernels, which keep every address
inside its tensor and OR a bit into an int32 word, one per device and per kernel family
(:class:`ErrorWord`). Three families use one: varlen (:mod:`rocmflash.kernels.varlen_checks`,
reported by :mod:`rocmflash.api.varlen`), decode (:mod:`rocmflash.kernels.kv_decode`, reported by
:mod:`rocmflash.api.decode_errors`) and the fp8 forward (:mod:`rocmflash.kernels.fp8_errors`). Each
keeps only its bits and its :class:`Report` (what each bit says); the word and its host side are here:

* :meth:`ErrorWord.read_and_report` -- read the word now (a wait on a GPU), reset it and raise: what a
  family's ``check_errors(device)`` does for each device.
* :meth:`ErrorWord.poll` -- on a GPU, look at the last *finished* asynchronous copy of the word (pinned
  host memory and an event: no wait) and start a copy every ``every`` calls; neither while a CUDA graph
  is captured. On the CPU (Triton's interpreter) there is no GPU to wait for: the family says whether
  its poll reads the word at once.

The raised ``ValueError`` reads ``"<api> on <device>: <how> got <what each set bit means><tail>"``.
"""

from __future__ import annotations

from typing import NamedTuple, TYPE_CHECKING

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
    """One GPU's watch on its error word: calls since the last copy started, the event that completes the
    copy in flight (None: none), and the pinned host buffer the copy writes (made at the first copy)."""

    __slots__ = ("calls", "event", "host")

    def __init__(self):
        self.calls, self.event, self.host = 0, None, None


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

    def read_and_report(self, device, how: str, report: Report) -> None:
        """Read ``device``'s word (a wait on a GPU) and, when a bit is set, reset it and raise ``ValueError``."""
        word = self.words.get(device)
        bits = int(word.item()) if word is not None else 0
        watch = self.watches.get(device)
        if watch is not None:
            watch.event = None  # a copy in flight holds nothing newer than this read
        if bits:
            word.zero_()
            raise ValueError(report.message(bits, device, how))

    def poll(self, device, report: Report, every: int, capturing=capturing, cpu_how=None) -> None:
        """Raise what an earlier, finished copy of ``device``'s word shows; start a copy every ``every`` calls.

        Never waits for a GPU. ``capturing(device)``: whether a graph is being captured (then nothing is
        queried or copied; replays still set bits, seen after capture). On the CPU the word is read at
        once, reported as ``cpu_how``, when that is given; None leaves the CPU to the caller."""
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
            if bits:
                self.word(device).zero_()
                raise ValueError(report.message(bits, device, "an earlier call"))
        if watch.calls >= every:
            watch.calls = 0
            word = self.word(device)
            if watch.host is None:
                watch.host = torch.zeros(1, dtype=torch.int32, pin_memory=True)
            with on_device(word):
                watch.host.copy_(word, non_blocking=True)
                watch.event = torch.cuda.Event()
                watch.event.record()


__all__ = ["ErrorWord", "Report", "Watch", "capturing", "device_key"]
