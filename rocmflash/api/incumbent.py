"""The platform's own attention as one more timed candidate, and the run-time dispatch to it where it won.

Importing rocmflash must never make a model slower. On CUDA, PyTorch's SDPA runs FlashAttention-2,
cuDNN's or the memory-efficient kernel; on ROCm, AOTriton's or CK's -- each a tuned kernel. So a tune
times them too, as production autotuners keep the vendor kernel among their choices: for each tuned
forward problem the live phase gates and times every SDPA backend this torch offers (``default``:
SDPA's own choice, then ``flash``, ``cudnn``, ``efficient`` where the platform has them) in the same
worker, on the same rotating inputs, with the same cache flush and repetitions as the Triton configs,
forward alone and forward+backward (a backend's backward needs its own forward, so training compares
whole steps: SDPA's forward+backward against rocmflash's served forward+backward). The entry keeps
the best as ``incumbent``::

    "incumbent": {"backend": "cudnn", "time_ms": 0.41, "triton_ms": 0.52,
                  "train": {"backend": "cudnn", "time_ms": 1.30, "triton_ms": 1.61},
                  "backends": {"default": {...}, "flash": {...}, ...}}

At run time (:func:`serving_backend`) a call whose entry says the incumbent was faster runs it
(``F.scaled_dot_product_attention`` with that backend; no copies, ``enable_gqa`` for GQA), a
forward-only call by the forward times, a call that needs gradients by the training times.
Only where SDPA computes the same function: no LSE wanted, and causal only with ``Sq == Sk`` (SDPA's
causal mask is top-left aligned, rocmflash's bottom-right).

Decode-shaped calls (a few queries over many keys, :func:`rocmflash.kernels.decode.host.is_decode_shaped`) are
decided by their ``decode-`` entry instead (:func:`decode_timing`: the entry of the call's KV-length and batch
buckets, or one bucket away): its ``incumbent`` is timed eagerly, host time included
(:func:`rocmflash.tuning.incumbent_worker.measure_decode`, ``rocmflash db refresh-incumbents --decode``), since at
small batch and short caches a decode step is host-bound and the GPU time alone would hide what the user pays.
One query token with ``causal=True`` is SDPA's non-causal call (bottom-right: the token sees every key).
``flash_attn_with_kvcache`` always runs the decode kernel: SDPA cannot take ``cache_seqlens``, ``cache_leftpad``,
a block table or the in-place append without copies.

The served backend always exists. Every field records what it was timed on (``"timed_on"``,
:func:`rocmflash.hw.platform.sdpa_record`: the platform, torch's version, ``torch.version.cuda``/``hip``, cuDNN's
version or ROCm's flash library where torch says). At run time a backend serves only where
:func:`serving_refusal` finds nothing against it: the field was timed on this platform (CUDA, ROCm or CPU: another
platform's times say nothing of this one; a field without the record is judged by its database's fingerprint
where that names a GPU runtime, :func:`database_platform`), and this torch offers the backend here (``cudnn``
never on ROCm, :func:`rocmflash.hw.platform.missing_sdpa_backend`). Another torch *version* of the same platform
does not refuse: the backend still exists, and refusing would leave every shipped entry unused after a torch
upgrade; ``rocmflash explain`` shows both versions. Where it refuses, rocmflash's kernel serves and ``explain``
says why. A backend torch offers may still refuse a call's shape (``RuntimeError: No available kernel``): the
first served call of each problem is guarded (:func:`first_call`): where SDPA raises, that problem falls back to
rocmflash's kernel with one warning, and later calls do not try SDPA again.
"""

from __future__ import annotations

from typing import Optional

#: the candidate that is SDPA's own backend choice (no ``sdpa_kernel`` context: the cheapest call)
DEFAULT = "default"


def candidates() -> list[str]:
    """Backend names a tune times on this platform: ``default`` first, then the named ones torch has here."""
    from rocmflash.hw.platform import sdpa_backends

    return [DEFAULT, *sdpa_backends()]


def applies(causal: bool, seqlen_q: int, seqlen_k: int, need_lse: bool = False) -> bool:
    """Whether SDPA computes what rocmflash would: no LSE, causal only when the mask alignments agree."""
    return not need_lse and (not causal or seqlen_q == seqlen_k)


def sdpa_causal(causal: bool, seqlen_q: int) -> bool:
    """SDPA's ``is_causal`` for rocmflash's ``causal`` on a call :func:`shape_excludes` lets through: one query
    token sees every key (bottom-right), which is SDPA's non-causal call (its top-left mask would leave the token
    key 0 only)."""
    return bool(causal) and seqlen_q > 1


def shape_excludes(causal: bool, seqlen_q: int, seqlen_k: int, group: int) -> Optional[str]:
    """Why a call of this shape never runs the incumbent, or None: SDPA computes another function (causal with
    ``Sq != Sk``; a decode-shaped call of one query token is SDPA's non-causal call, :func:`sdpa_causal`). A
    decode-shaped call (:func:`is_decode`) is decided by its ``decode-`` entry (:func:`decode_timing`), any other
    by its forward entry. Run-time dispatch and ``rocmflash explain`` both ask this."""
    if applies(causal, seqlen_q, seqlen_k) or (seqlen_q == 1 and is_decode(seqlen_q, seqlen_k, group)):
        return None
    return "causal with Sq != Sk: SDPA's causal mask is top-left aligned, rocmflash's bottom-right"


def is_decode(seqlen_q: int, seqlen_k: int, group: int) -> bool:
    """Whether the call is decode-shaped: rocmflash's split-KV decode kernel and its ``decode-`` entries serve it."""
    from rocmflash.kernels.decode.shape import is_decode_shaped

    return is_decode_shaped(seqlen_q, seqlen_k, group)


_SDPA: list = []  #: torch's own scaled_dot_product_attention, bound on first use


def _bind_sdpa() -> None:
    import torch

    # torch's own function, not the attribute F.scaled_dot_product_attention: under patch_sdpa that
    # attribute is rocmflash's wrapper, which would route the call back here
    _SDPA.append(torch._C._nn.scaled_dot_product_attention)


def sdpa_attention(backend: str, q, k, v, causal: bool, scale: float, gqa: Optional[bool] = None):
    """``softmax(scale * q kᵀ) v`` of ``(B, H, S, D)`` tensors by SDPA's ``backend`` (differentiable).
    ``gqa``: whether ``q`` has more heads than ``k`` (None: compared here)."""
    if not _SDPA:
        _bind_sdpa()
    sdpa = _SDPA[0]
    if gqa is None:
        gqa = q.shape[1] != k.shape[1]
    if backend == DEFAULT:
        return sdpa(q, k, v, is_causal=causal, scale=scale, enable_gqa=gqa)
    switches = _switches()
    if switches is None:  # a torch without the documented switches: its context manager
        from torch.nn.attention import sdpa_kernel

        from rocmflash.hw.platform import sdpa_backend_enum

        with sdpa_kernel([sdpa_backend_enum(backend)]):
            return sdpa(q, k, v, is_causal=causal, scale=scale, enable_gqa=gqa)
    # what sdpa_kernel([backend]) does -- only this backend enabled, then every switch as it was -- without its
    # context manager's cost (~10 us a call, more than the dispatch's whole budget)
    was = [enabled() for _, enabled, _ in switches]
    try:
        for name, _, enable in switches:
            enable(name == backend)
        return sdpa(q, k, v, is_causal=causal, scale=scale, enable_gqa=gqa)
    finally:
        for (_, _, enable), on in zip(switches, was):
            enable(on)


_SWITCHES: list = []  #: [(backend name, is-enabled, enable)] of torch.backends.cuda, or [None] without them


def _switches() -> Optional[list]:
    """``torch.backends.cuda``'s documented switch of every SDPA backend (math included: ``sdpa_kernel`` with one
    backend turns the math fallback off too), or None where this torch lacks one."""
    if not _SWITCHES:
        import torch.backends.cuda as cuda

        names = (("flash", "flash_sdp_enabled", "enable_flash_sdp"),
                 ("cudnn", "cudnn_sdp_enabled", "enable_cudnn_sdp"),
                 ("efficient", "mem_efficient_sdp_enabled", "enable_mem_efficient_sdp"),
                 ("math", "math_sdp_enabled", "enable_math_sdp"))
        found = [(name, getattr(cuda, on, None), getattr(cuda, enable, None)) for name, on, enable in names]
        _SWITCHES.append(found if all(on and enable for _, on, enable in found) else None)
    return _SWITCHES[0]


def sdpa_server(backend: Optional[str], causal: bool, gqa: bool):
    """A call's served incumbent as one callable ``(q, k, v, scale) -> out`` made when its plan is (None: no
    incumbent): what :func:`sdpa_attention` does, with the branches a repeat call would take decided once and only
    the arguments SDPA needs (its parser charges for every keyword; ``scale=None`` is SDPA's own ``1/sqrt(D)``).
    The public API's repeat calls run it directly (``rocmflash.api.attention``, ``patch_sdpa``)."""
    if backend is None:
        return None
    if backend != DEFAULT:
        def sdpa_attention_with(q, k, v, scale):
            return sdpa_attention(backend, q, k, v, causal, scale, gqa)
        return sdpa_attention_with
    if not _SDPA:
        _bind_sdpa()
    sdpa = _SDPA[0]
    if gqa:
        def sdpa_attention_gqa(q, k, v, scale):
            return sdpa(q, k, v, is_causal=causal, scale=scale, enable_gqa=True)
        return sdpa_attention_gqa
    if causal:
        def sdpa_attention_causal(q, k, v, scale):
            return sdpa(q, k, v, is_causal=True) if scale is None else sdpa(q, k, v, is_causal=True, scale=scale)
        return sdpa_attention_causal

    def sdpa_attention_plain(q, k, v, scale):
        return sdpa(q, k, v) if scale is None else sdpa(q, k, v, scale=scale)
    return sdpa_attention_plain


class SdpaKernel:
    """A kernel-variant look-alike (``launch(q, k, v, cfg, causal, scale, out)``) running an SDPA backend,
    so the live runner's gate and timing loop take it as they take a Triton config. ``write_out``: copy
    into ``out`` (the gate checks ``out``); the timed launches skip the copy, which SDPA does not pay."""

    def __init__(self, backend: str, write_out: bool):
        self.backend, self.write_out = backend, write_out

    def launch(self, q, k, v, cfg, causal: bool, scale: float, out=None, lse=None):
        o = sdpa_attention(self.backend, q, k, v, causal, scale)
        if self.write_out and out is not None:
            out.copy_(o)


def incumbent_field(result: dict, triton_ms: Optional[float]) -> Optional[dict]:
    """The entry's ``incumbent`` from a :func:`rocmflash.tuning.incumbent_worker.measure` result and the Triton winner's forward time: the
    fastest gated backend forward and forward+backward, with every backend's outcome and what they were timed on
    (``timed_on``: the result's, :func:`rocmflash.hw.platform.sdpa_record`, else this process's)."""
    backends = result.get("backends") or {}
    ok = {name: r for name, r in backends.items() if r.get("status") == "ok" and r.get("time_ms")}
    summary = {name: {k: (round(v, 5) if isinstance(v, float) else v) for k, v in r.items() if v is not None}
               for name, r in backends.items()}
    timed_on = result.get("timed_on") or _sdpa_record()  # the worker's (same environment as this process)
    if not ok:
        return {"backend": None, "time_ms": None, "triton_ms": triton_ms, "backends": summary, "timed_on": timed_on}
    fwd = min(ok, key=lambda n: ok[n]["time_ms"])
    field = {"backend": fwd, "time_ms": round(ok[fwd]["time_ms"], 5), "triton_ms": triton_ms, "backends": summary,
             "timed_on": timed_on}
    trained = {n: r for n, r in ok.items() if r.get("train_ms")}
    if trained:
        best = min(trained, key=lambda n: trained[n]["train_ms"])
        field["train"] = {"backend": best, "time_ms": round(trained[best]["train_ms"], 5),
                          "triton_ms": result.get("triton_train_ms") and round(result["triton_train_ms"], 5)}
    return field


#: a named backend is served instead of SDPA's own choice (``default``) only when it was this much faster: pinning
#: one kernel costs every call its switch and gives up SDPA's per-shape choice for the calls the entry also serves
#: (its other lengths and batches), where the pinned kernel can be far slower (H100 decode: ``flash`` won B8 KV32k
#: by 0.8 % and lost B32 KV64k by 22 %)
NAMED_BACKEND_MARGIN = 0.02


def preferred_backend(incumbent: Optional[dict], backend: Optional[str], train: bool,
                      triton_ms: Optional[float] = None) -> Optional[str]:
    """``backend``, or ``default`` where the field's ``backends`` show SDPA's own choice gated, within
    :data:`NAMED_BACKEND_MARGIN` of it and, given rocmflash's time ``triton_ms``, faster than rocmflash too (else
    the named backend is what beat rocmflash; ``train``: forward+backward times)."""
    if not backend or backend == DEFAULT or not incumbent:
        return backend
    backends = incumbent.get("backends") or {}
    time_key = "train_ms" if train else "time_ms"
    named, default = (backends.get(name) or {} for name in (backend, DEFAULT))
    if default.get("status") == "ok" and default.get(time_key) and named.get(time_key) \
            and default[time_key] <= named[time_key] * (1.0 + NAMED_BACKEND_MARGIN) \
            and (triton_ms is None or default[time_key] < triton_ms):
        return DEFAULT
    return backend


def winner(incumbent: Optional[dict], train: bool, check: bool = True) -> Optional[str]:
    """The backend an entry's ``incumbent`` field says to serve (None: rocmflash's kernel is as fast or faster;
    a named backend within :data:`NAMED_BACKEND_MARGIN` of SDPA's own choice: ``default``), and only one that may
    serve here (:func:`serving_refusal` of the field's record; ``check=False``: the times' verdict alone, for
    ``rocmflash explain`` to say why it does not serve)."""
    if not incumbent:
        return None
    side = incumbent.get("train") if train else incumbent
    if not side or not side.get("backend") or side.get("time_ms") is None or side.get("triton_ms") is None:
        return None
    if side["time_ms"] >= side["triton_ms"]:
        return None
    backend = preferred_backend(incumbent, side["backend"], train, side["triton_ms"])
    return offered(backend, incumbent) if check else backend


# ----------------------------------------------------------------------------- the served backend always exists
def platform_refusal(field: Optional[dict], db_platform: Optional[str] = None) -> Optional[str]:
    """Why an incumbent ``field``'s times do not decide on this torch's platform, or None: its record
    (``timed_on``) -- or, for a field written before the record existed, ``db_platform`` (its database's
    fingerprint, :func:`database_platform`) -- names another platform (CUDA, ROCm, CPU) than this torch's.
    Neither known: nothing against it (:func:`backend_refusal` still keeps a backend this platform lacks away).
    The torch version is not compared: the same platform's backends survive an upgrade (``explain`` shows both)."""
    from rocmflash.hw.platform import PLATFORM_NAMES, record_platform, torch_platform

    timed, source = record_platform(field.get("timed_on")) if isinstance(field, dict) else None, "its record"
    if timed is None:
        timed, source = db_platform, "its database's fingerprint"
    here = torch_platform()
    if timed is None or timed == here:
        return None
    return (f"the incumbent was timed on {PLATFORM_NAMES[timed]} ({source}) and this torch is "
            f"{PLATFORM_NAMES[here]}: its times say nothing here, rocmflash's kernel serves")


def backend_refusal(backend: Optional[str]) -> Optional[str]:
    """Why this torch does not offer ``backend`` on this platform, or None (None and ``default``, SDPA's own choice,
    always exist): a named SDPA backend the platform lacks (``cudnn`` on ROCm) or this torch's ``SDPBackend`` does
    not define, torch's ``varlen_attn`` where this torch has none, a name rocmflash does not know."""
    if backend is None or backend == DEFAULT:
        return None
    from rocmflash.hw.platform import PLATFORM_NAMES, SDPA_BACKENDS, missing_sdpa_backend, torch_platform, varlen_attn

    if backend == _VARLEN_NAME:
        return None if varlen_attn()[0] is not None else \
            f"the entry names {backend}, which this torch does not have: rocmflash's kernel serves"
    if backend not in SDPA_BACKENDS:
        return f"the entry names SDPA backend {backend!r}, which rocmflash does not know: rocmflash's kernel serves"
    why = missing_sdpa_backend(backend)
    if why is None:
        return None
    return (f"the entry names {backend}, which this platform ({PLATFORM_NAMES[torch_platform()]}) does not offer "
            f"({why}): rocmflash's kernel serves")


_VARLEN_NAME = "varlen_attn"  #: :data:`rocmflash.api.varlen_incumbent.NAME` (that module imports this one)


def serving_refusal(backend: Optional[str], field: Optional[dict] = None,
                    db_platform: Optional[str] = None) -> Optional[str]:
    """Why ``backend`` -- what ``field``'s times chose -- may not serve here, or None (also for no backend): the
    one check every served incumbent passes (:func:`platform_refusal`, then :func:`backend_refusal`)."""
    if backend is None:
        return None
    return platform_refusal(field, db_platform) or backend_refusal(backend)


def offered(backend: Optional[str], field: Optional[dict] = None) -> Optional[str]:
    """``backend`` where :func:`serving_refusal` finds nothing against it, else None (rocmflash's kernel)."""
    return backend if serving_refusal(backend, field) is None else None


_DB_PLATFORM: dict = {}  #: database path -> the GPU platform its fingerprint names (None: unknown)


def database_platform(path: Optional[str]) -> Optional[str]:
    """The GPU platform (``"cuda"``, ``"hip"``) the database at ``path`` was last saved on
    (:func:`rocmflash.hw.platform.runtime_platform` of its fingerprint), or None: no path, unreadable, or no GPU
    runtime named. What judges the entries written before incumbent fields recorded where they were timed.
    Read once per file (forgotten after a save and by ``rocmflash.clear_cache``)."""
    if not path:
        return None
    try:
        return _DB_PLATFORM[path]
    except KeyError:
        pass
    from rocmflash.db.files import ConfigDB, DBError
    from rocmflash.hw.platform import runtime_platform

    try:
        fingerprint = ConfigDB.read(path).get("fingerprint")
    except (DBError, OSError, ValueError):
        fingerprint = None
    platform = _DB_PLATFORM[path] = runtime_platform(fingerprint.get("runtime")) \
        if isinstance(fingerprint, dict) else None
    return platform


def _forget_db_platforms() -> None:
    _DB_PLATFORM.clear()


def _sdpa_record() -> dict:
    from rocmflash.hw.platform import sdpa_record

    return sdpa_record()


# ----------------------------------------------------------------------------- a refusal on the first call
#: ``(backend, train, problem)`` -> the error of a served first call that raised: the problem is rocmflash's from
#: then on, in this process. Not forgotten by ``rocmflash.clear_cache``: whether this torch runs a backend for a
#: problem does not depend on the database (a database naming another backend tries that one).
_FELL_BACK: dict = {}


_WARNED: set = set()  #: ``(backend, train, problem[0])`` already warned of: one warning whatever the lengths


def refusal_problem(q, k, causal: bool) -> tuple:
    """What a first-call refusal of SDPA falls back for (with the backend and the side), ``(what, lengths)``: the
    device, dtype, head counts, head dim and SDPA's causal flag, and the powers of two of the query and key
    lengths -- not the exact lengths, so a cache one key longer each step is tried once, not once per step (and a
    refusal at one length bucket leaves the others to try; only the first is warned of)."""
    B, Hq, Sq, D = q.shape
    return ((q.device, q.dtype, Hq, k.shape[1], D, bool(causal)),
            (int(Sq - 1).bit_length(), int(k.shape[2] - 1).bit_length()))


def fell_back(backend: Optional[str], train: bool, problem: tuple) -> bool:
    """Whether ``backend`` raised on the first served call of ``problem`` (:func:`first_call`) in this process."""
    return (backend, bool(train), problem) in _FELL_BACK


def sdpa_fallbacks() -> dict:
    """``{(backend, train, problem): error}`` of every problem that fell back to rocmflash's kernel in this process
    (:func:`first_call`)."""
    return dict(_FELL_BACK)


def first_call(sdpa, backend: str, train: bool, problem: tuple, q, *args):
    """``sdpa(q, *args)`` -- the first served call of ``problem`` (``(what, lengths)``, :func:`refusal_problem`) by
    ``backend`` -- or None where it raised a refusal: torch's ``RuntimeError`` (``No available kernel``) or
    ``NotImplementedError`` for inputs this torch does not run with that backend. Then the problem is recorded
    (:func:`fell_back`) and one warning says so (one per backend, side and ``what``, whatever the lengths); the
    caller serves this call and the later ones by rocmflash's kernel. Out of memory is not a refusal (it passes);
    nor is anything raised while a CUDA graph captures: the capture may be broken by the failed call, and a
    fallback launched into it would hide why (it propagates, and the next eager call decides)."""
    try:
        return sdpa(q, *args)
    except (RuntimeError, NotImplementedError) as err:
        import torch

        from rocmflash.kernels.error_words import capturing

        if isinstance(err, torch.OutOfMemoryError) or capturing(q.device):
            raise
        key = (backend, bool(train), problem)
        from rocmflash.messages import error_line

        _FELL_BACK[key] = error_line(err)
        if (backend, bool(train), problem[0]) not in _WARNED:
            _WARNED.add((backend, bool(train), problem[0]))
            import warnings

            warnings.warn(f"rocmflash: SDPA backend {backend} raised on the first {'training ' if train else ''}call "
                          f"of this problem (q {tuple(q.shape)} {q.dtype} on {q.device}): {_FELL_BACK[key]}; "
                          "rocmflash's kernel serves it from now on (other lengths that raise too: no warning)",
                          RuntimeWarning, stacklevel=4)
        return None


#: what a decode entry's incumbent times are (the field's ``timing``): what a user's eager call pays
DECODE_TIMING = ("eager per call, host time included (back-to-back calls between two events): rocmflash.attention "
                 "served by the decode kernel with the entry's config vs the same call served by each SDPA backend")
#: what the incumbent times of a short dense problem's entry are (``rocmflash db refresh-incumbents --small``): what a user's
#: eager call pays, forward and forward+backward -- short sequences are host-bound, the kernel time alone hides that
EAGER_TIMING = ("eager per call, host time included (back-to-back calls between two events): rocmflash.attention "
                "served by the Triton kernel vs the same call served by each SDPA backend; forward, and forward + "
                "torch.autograd.grad of q, k, v")
#: a decode entry's incumbent decides for calls this many buckets (KV length and batch together) from it at most
DECODE_MAX_BUCKET_DISTANCE = 1


def decode_timing(gpu_name: Optional[str], head_dim: int, dtype, group: int, seqlen_k: int, batch: int,
                  db_path: Optional[str] = None) -> tuple:
    """``(entry key or None, its incumbent field or None, why that timing does not decide or None)`` for a dense
    decode-shaped call: the measured 16-bit, unpaged ``decode-`` entry nearest in KV-length and batch buckets
    (ranked as :func:`rocmflash.db.lookups.decode.lookup_decode` ranks them, so it is the entry whose config the
    decode kernel serves), read from ``db_path`` or the GPU's databases (the user's, then the shipped one)."""
    from rocmflash.db.lookups.decode import nearest_decode_entry

    if gpu_name is None:
        return None, None, "no GPU in the catalog: no decode entry (the decode kernel's per-arch default)"
    rows = list(_entry_rows(gpu_name, db_path))
    found = nearest_decode_entry(rows, int(head_dim), dtype, int(group), seqlen_k, batch, same_page_size=True)
    if found is None:
        return None, None, "no measured decode entry: the decode kernel (no incumbent timed)"
    distance, key, entry, _ = found
    field = entry.get("incumbent") or None
    if distance > DECODE_MAX_BUCKET_DISTANCE:
        return key, field, f"the decode entry {key} is {distance} buckets away: its incumbent timing is not used"
    if field is None:
        return key, None, (f"the decode entry {key} has no incumbent timing "
                           "(rocmflash db refresh-incumbents --decode adds it)")
    path = next((p for _, p, k, e in rows if k == key and e is entry), None)
    return key, field, platform_refusal(field, database_platform(path))


def _entry_rows(gpu_name: str, db_path: Optional[str]):
    """``(order, path, key, entry)`` of every entry a decode lookup reads: ``db_path`` alone, else the GPU's
    databases (:func:`rocmflash.db.iter_database_entries`: the user's, then the shipped one)."""
    from rocmflash.db import iter_database_entries, read_database

    if db_path:
        return ((0, db_path, k, e) for k, e in read_database(db_path)["entries"].items())
    return iter_database_entries(gpu_name)


#: a decode verdict must hold on a host this many times slower than the tuning host. rocmflash's decode route (Python,
#: a plan, two Triton launches) costs 2.5-3x SDPA's C++ call on the host, and lent H100 hosts of one model measured
#: that route from 62 to 150 µs a call (``docs/evidence/issue28-acceptance-2026-11-27c-h100.md``), twice the shipped H100
#: database's floor (74 µs, B1 at 2k keys): a kernel lead of 0.5 % on the tuning host became 0.73x on a slower one
#: (B8, 8k keys, GQA 4).
DECODE_HOST_SLOWDOWN = 2.0


def decode_host_floor(gpu_name: Optional[str], head_dim: int, dtype, db_path: Optional[str] = None) -> Optional[dict]:
    """The host floors of a decode call on the tuning host: the :data:`DECODE_TIMING` incumbent field (``time_ms``
    SDPA, ``triton_ms`` rocmflash's route, eager, host included) of the smallest problem (batch bucket times KV
    bucket; ties: the least ``triton_ms``) among the servable 16-bit, unpaged ``decode-`` entries of this head dim
    and dtype, any GQA ratio -- the one whose time is nearly all host (B1 at 2k keys: the kernel runs ~8 µs of its
    ~75) -- read from ``db_path`` or the GPU's databases, timed on this platform (:func:`platform_refusal`); None
    without one."""
    from rocmflash.config import normalize_dtype
    from rocmflash.db import servable
    from rocmflash.db.lookups.decode import parse_decode_key

    if gpu_name is None:
        return None
    want, floor = (int(head_dim), normalize_dtype(dtype)), None
    for _, path, key, entry in _entry_rows(gpu_name, db_path):
        p = parse_decode_key(key)
        if p is None or (p["head_dim"], p["dtype"]) != want or p["page_size"] or p.get("kv_dtype") \
                or not isinstance(entry, dict) or not servable(entry):
            continue
        field = entry.get("incumbent")
        if isinstance(field, dict) and field.get("timing") == DECODE_TIMING and _positive(field.get("triton_ms")) \
                and _positive(field.get("time_ms")) and platform_refusal(field, database_platform(path)) is None:
            rank = (p["batch_bucket"] * p["kv_bucket"], field["triton_ms"])
            if floor is None or rank < floor[0]:
                floor = (rank, field)
    return floor[1] if floor else None


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0


def decode_winner(field: Optional[dict], floor: Optional[dict]) -> tuple:
    """:func:`decode_verdict`, and only a backend that may serve here: one :func:`serving_refusal` refuses gives
    ``(None, the refusal)`` -- rocmflash's decode kernel, and why."""
    backend, why = decode_verdict(field, floor)
    refusal = serving_refusal(backend, field)
    return (None, refusal) if refusal else (backend, why)


def decode_verdict(field: Optional[dict], floor: Optional[dict]) -> tuple:
    """``(backend or None, why)`` for a dense decode-shaped call from its ``decode-`` entry's eager ``field``: the
    entry's own verdict (:func:`winner`), except that the decode kernel keeps a call only where it would still be
    ahead on a host :data:`DECODE_HOST_SLOWDOWN` times slower: each side's expected time there is the longer of
    its eager time and its host floor (``floor``, :func:`decode_host_floor`) times the slowdown, as in
    :func:`rocmflash.api.host_bound.expected_ms`. Without a floor the verdict stands. ``why`` says which rule
    decided."""
    backend = winner(field, False, check=False)
    if backend is not None:
        return backend, "SDPA was faster (eager per call, host time included)"
    kept = None, "the decode kernel was as fast or faster (eager per call, host time included)"
    if not field or not field.get("backend") or not _positive(field.get("time_ms")) \
            or not _positive(field.get("triton_ms")) or not floor:
        return kept
    sdpa_ms, triton_ms = field["time_ms"], field["triton_ms"]
    slow_sdpa = max(sdpa_ms, DECODE_HOST_SLOWDOWN * min(floor["time_ms"], sdpa_ms))
    slow_triton = max(triton_ms, DECODE_HOST_SLOWDOWN * min(floor["triton_ms"], triton_ms))
    if slow_triton < slow_sdpa:
        return kept
    return preferred_backend(field, field["backend"], False), (
        f"host margin: the decode kernel was as fast or faster here ({triton_ms * 1e3:.1f} vs {sdpa_ms * 1e3:.1f} µs), "
        f"but on a host {DECODE_HOST_SLOWDOWN:g}x slower its route would take {slow_triton * 1e3:.1f} µs against "
        f"SDPA's {slow_sdpa * 1e3:.1f} (host floors {floor['triton_ms'] * 1e3:.1f} / {floor['time_ms'] * 1e3:.1f} µs)")


def decode_field(result: dict) -> dict:
    """A decode entry's ``incumbent`` from :func:`rocmflash.tuning.incumbent_worker.measure_decode`'s result: the
    forward's field shape (:func:`incumbent_field`, no training side: decode is inference) with ``timing``
    saying the times are eager per call, host included."""
    triton_ms = result.get("triton_ms")
    if result.get("status") != "ok" or triton_ms is None:
        return {"backend": None, "time_ms": None, "triton_ms": triton_ms, "timing": DECODE_TIMING,
                "error": f"{result.get('status')}: {result.get('error')}"}
    field = incumbent_field({"backends": result.get("backends"), "timed_on": result.get("timed_on")},
                            round(triton_ms, 5))
    field["timing"] = DECODE_TIMING
    return field


def eager_field(result: dict) -> dict:
    """A short dense problem's ``incumbent`` from :func:`rocmflash.tuning.incumbent_worker.measure_eager`'s result:
    the forward's field shape with its training side (:func:`incumbent_field`) and ``timing`` =
    :data:`EAGER_TIMING`; an ``error`` (and no backend) when rocmflash's own route did not run."""
    triton_ms = result.get("triton_ms")
    if result.get("status") != "ok" or triton_ms is None:
        return {"backend": None, "time_ms": None, "triton_ms": triton_ms, "timing": EAGER_TIMING,
                "error": f"{result.get('status')}: {result.get('error')}"}
    field = incumbent_field(result, round(triton_ms, 5))
    field["timing"] = EAGER_TIMING
    return field


def _register() -> None:
    """Forget the databases' platforms when a database is saved in this process or ``rocmflash.clear_cache`` runs."""
    from rocmflash.api.clear_hooks import register_clear
    from rocmflash.db.files import AFTER_SAVE

    AFTER_SAVE.append(_forget_db_platforms)
    register_clear(_forget_db_platforms)


_register()

__all__ = ["DEFAULT", "NAMED_BACKEND_MARGIN", "preferred_backend", "DECODE_TIMING", "EAGER_TIMING", "eager_field", "DECODE_MAX_BUCKET_DISTANCE", "decode_timing", "decode_field", "is_decode",
           "DECODE_HOST_SLOWDOWN", "decode_host_floor", "decode_winner", "decode_verdict",
           "sdpa_causal", "candidates", "applies", "shape_excludes", "sdpa_attention", "SdpaKernel", "incumbent_field",
           "winner", "platform_refusal", "backend_refusal", "serving_refusal", "offered", "database_platform",
           "refusal_problem", "fell_back", "sdpa_fallbacks", "first_call"]
