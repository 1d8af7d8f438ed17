"""KV-cache decode: split-KV attention of a few new query tokens over a (paged) cache, then a combine.

Decode is bandwidth-bound: each step reads the whole K/V cache of every sequence once and
does two tiny matrix products per key block. Two choices follow from that.

* **One program per (sequence, K/V head, split), holding every query row of its GQA
  group.** With ``GROUP = Hq / Hkv`` query heads and ``Sq`` new tokens, the program's
  rows are the ``Sq * GROUP`` (token, head) pairs that read the same K/V head, padded to
  ``BLOCK_M >= 16`` (``tl.dot`` needs 16). K and V are then loaded once per K/V head
  instead of once per query head (8x less traffic at GQA 8:1).
* **Split-KV.** ``B * Hkv`` programs are far too few to keep a GPU's memory system busy
  at small batches (B=1, Hkv=8: 8 programs on 132 SMs / 304 CUs), so the key range of each
  sequence is cut into ``num_splits`` chunks of whole key blocks. Each program writes a
  normalised fp32 partial output and its log2 LSE; :func:`_decode_combine` merges the
  chunks per row: ``L = log2(sum_s 2^L_s)``, ``O = sum_s 2^(L_s - L) O_s`` -- one program per
  output row, all splits in one load.

The cache is contiguous ``(B, S_max, Hkv, D)`` or paged ``(num_blocks, page_size, Hkv, D)`` with a block
table: a key's physical row is ``block_table[b, j // page_size]`` at offset ``j % page_size``, looked up per
key (any page size). Masks are the bands of :mod:`rocmflash.kernels.masks` with the query token index as the
row (bottom-right: token ``t`` sits at position ``L - Sq + t``). A left-padded cache (flash-attn's
``cache_leftpad``: sequence ``b`` starts at key ``leftpad[b]``, as transformers' left-padded batches do) is one
more lower bound: the key range starts at the block holding ``leftpad[b]`` and that block's keys before it are
masked (and not loaded).

Attention sinks (gpt-oss's ``s_aux``: one logit per query head joined to the softmax's denominator, a key whose
value row is zero) join once per row, in split 0's running max and sum (:func:`rocmflash.kernels.decode.kernel._join_sink`); the
combine and the fused merge then need nothing of their own, and a row's LSE holds the sink.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Optional, TYPE_CHECKING

from rocmflash.config import KernelConfig
from rocmflash.kernels import common as C
from rocmflash.kernels import error_words as EW
from rocmflash.kernels.decode import quant as KQ
from rocmflash.kernels import masks as M
from rocmflash.kernels.decode.checks import error_word
from rocmflash.kernels.decode.kernel import _decode_combine, _decode_split

if TYPE_CHECKING:  # annotations only: torch is imported where a launch needs it
    import torch
KERNELS = ("_decode_split", "_decode_combine")




def forced_merge(value: Optional[str]) -> Optional[bool]:
    """:data:`FUSED_COMBINE` from the value of ``ROCMFLASH_DECODE_FUSED_COMBINE``: ``1`` True, ``0`` False, else None."""
    return {"1": True, "0": False}.get((value or "").strip())


#: a launch of several splits merges them in its last program per (sequence, K/V head) instead of a second
#: (combine) launch: one launch and one buffer less per call, which is what a small decode step costs on the
#: host. None (the default): :func:`fuses_merge` decides per call -- on for small caches on CUDA, where it was
#: timed; True / False: always / never (``ROCMFLASH_DECODE_FUSED_COMBINE=1`` / ``=0``). The merge relies on the
#: arrival count's acquire/release ordering, which the CPU interpreter, running programs one after another,
#: cannot exercise. Never while a CUDA graph is captured (its counts would be the graph's).
FUSED_COMBINE = forced_merge(os.environ.get("ROCMFLASH_DECODE_FUSED_COMBINE"))
#: the automatic rule fuses a call whose K and V caches hold at most this many bytes together (B1 over 8k keys,
#: GQA 32:8, D128, bf16): host-bound steps, where the second launch is part of what the user waits for. H100,
#: default ``flash_attn_with_kvcache`` (``benchmarks/decode_entry.py --fused``): B1 KV 2k/8k 90.1/59.1 µs fused against
#: 97.5/71.6 two launches, and so on in every run; at 4x these bytes won in one run and lost 4 % in another; from B8
#: on no change (``docs/evidence/decode-fused-auto-2026-11-27-h100.md``)
FUSED_AUTO_MAX_KV_BYTES = 32 * 2**20


def fuses_merge(forced, backend: str, on_gpu: bool, kv_bytes: int) -> bool:
    """Whether a decode launch of several splits should merge them itself (the caller also refuses it while a
    graph is captured): ``forced`` (:data:`FUSED_COMBINE`) when set; else on a CUDA GPU for caches of at most
    :data:`FUSED_AUTO_MAX_KV_BYTES` (K and V together). Not yet on ROCm by default: the merge's memory ordering
    has not been run on AMD hardware (``ROCMFLASH_DECODE_FUSED_COMBINE=1`` turns it on there)."""
    if forced is not None:
        return bool(forced)
    return on_gpu and backend == "cuda" and kv_bytes <= FUSED_AUTO_MAX_KV_BYTES


_ARRIVALS: dict = {}  #: (device, stream) -> int32 arrival counts, zero between launches


def arrival_counts(device, programs: int) -> torch.Tensor:
    """The int32 arrival counts of a fused launch of ``programs`` (sequence, K/V head) groups on ``device``'s
    current stream: zeros, which every launch leaves as it found them (its last program per group resets its
    count). One buffer per stream, so launches in flight on two streams never share a count."""
    import torch
    key = (device, _current_stream(device) if device.type == "cuda" else 0)
    counts = _ARRIVALS.get(key)
    if counts is None or counts.numel() < programs:
        counts = _ARRIVALS[key] = torch.zeros(max(256, C.next_pow2(programs)), dtype=torch.int32, device=device)
    return counts


def _current_stream(device) -> int:
    """The handle of ``device``'s current stream: torch's raw-stream query (what Triton's own launcher asks,
    a fraction of a µs), or the public ``torch.cuda.current_stream`` where a torch lacks it."""
    import torch
    index = device.index if device.index is not None else torch.cuda.current_device()
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw(index) if raw is not None else torch.cuda.current_stream(index).cuda_stream


# ----------------------------------------------------------------------------- configs
@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """Tiles and options of the decode kernels. ``num_splits=0``: chosen per call (:func:`choose_num_splits`)."""

    BLOCK_N: int = 64
    num_warps: int = 4
    num_stages: int = 2
    waves_per_eu: int = 0
    num_splits: int = 0

    def validate(self) -> "DecodeConfig":
        if self.BLOCK_N not in (16, 32, 64, 128, 256):
            raise ValueError(f"DecodeConfig.BLOCK_N={self.BLOCK_N!r} is invalid; expected one of 16, 32, 64, 128, 256")
        if not 0 <= int(self.num_splits) <= 128:
            raise ValueError(f"DecodeConfig.num_splits={self.num_splits!r} is invalid; expected 0..128 (0 = automatic)")
        self.kernel_config().validate()
        return self

    def kernel_config(self) -> KernelConfig:
        """The compile options as a :class:`KernelConfig` (what :func:`rocmflash.kernels.common.launch_kernel` takes)."""
        return _kernel_config(self.BLOCK_N, self.num_warps, self.num_stages, self.waves_per_eu)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "DecodeConfig":
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in fields}).validate()


_KCFG: dict = {}


def _kernel_config(block_n, num_warps, num_stages, waves_per_eu) -> KernelConfig:
    key = (block_n, num_warps, num_stages, waves_per_eu)
    cfg = _KCFG.get(key)
    if cfg is None:
        cfg = _KCFG[key] = KernelConfig(BLOCK_M=16, BLOCK_N=block_n, num_warps=num_warps, num_stages=num_stages,
                                        waves_per_eu=waves_per_eu)
    return cfg


def default_decode_config(arch: Optional[str], head_dim: int, kv_fp8: bool = False) -> DecodeConfig:
    """Per-arch starting point until a tuned entry exists.

    AMD CDNA: one stage (AMD's guidance for these loops), 4 waves, ``waves_per_eu=2``.
    NVIDIA sm_90: 4 warps, 3 stages so the next K/V blocks' loads are in flight (H100 sweep:
    88-93% of HBM at B >= 8 with one split program per SM, see :func:`programs_per_cu`).
    Wide head dims halve the key block to keep the K and V tiles in registers. An fp8 cache
    (``kv_fp8``) on NVIDIA doubles the key block (the bf16 block's bytes): H100, e4m3, D=128, 3 stages,
    page 256: 1.2-1.3x faster than BN64 (84-85 % of HBM at B=32), contiguous within 5 % of the best.
    """
    arch = arch or "generic"
    block_n = 64 if head_dim <= 128 else 32
    if arch.startswith("gfx9"):
        return DecodeConfig(BLOCK_N=block_n, num_warps=4, num_stages=1, waves_per_eu=2)
    if arch.startswith("sm_"):
        return DecodeConfig(BLOCK_N=2 * block_n if kv_fp8 else block_n, num_warps=4, num_stages=3)
    return DecodeConfig(BLOCK_N=32, num_warps=4, num_stages=1)


def choose_num_splits(batch: int, heads_kv: int, max_seqlen_k: int, block_n: int, compute_units: int,
                      programs_per_cu: int = 2) -> int:
    """KV splits per (sequence, K/V head): about ``programs_per_cu`` programs per CU/SM (rounded),
    each split at least 256 keys (or one key block) long, at most 64 and at most the number of
    key blocks. :func:`programs_per_cu` gives the target for a config.

    ``max_seqlen_k`` is the cache capacity, known without reading lengths from the GPU.
    """
    programs = max(1, batch * heads_kv)
    want = (2 * programs_per_cu * compute_units + programs) // (2 * programs)  # round half up
    blocks = max(1, -(-max_seqlen_k // block_n))
    min_keys = max(256, block_n)
    longest = max(1, max_seqlen_k // min_keys)
    return int(max(1, min(want, longest, 64, blocks)))


def programs_per_cu(cfg: "DecodeConfig", kv_fp8: bool = False) -> int:
    """Split programs per CU/SM that keep the memory system busy with ``cfg``'s loop.

    A pipelined loop (``num_stages >= 2``) keeps the next K/V block's loads in flight, so
    about one program per CU/SM suffices and more splits only add partial outputs to combine;
    a one-stage loop waits on each block's loads and needs about two programs per CU/SM to
    hide that. H100, D=128, GQA 8:1, one token (``archive/reports:bench/decode_sweep.py``,
    docs/evidence/decode-sweep-2026-11-24-h100.md): 3 stages at one program per SM reached 88-93%
    of HBM (B = 8/32, KV = 8k-64k), 2x-4x more splits 3-12% slower. An fp8 cache (``kv_fp8``) halves
    the bytes a pipelined loop has in flight, so it takes two programs: H100, e4m3 cache, B=8, KV 8k-64k,
    BN64 w4 s3 went from 75-536 us at one program per SM to 56-373 us at two (1.25x -> 1.66-1.83x the
    bf16 cache); at B=32 both rules give one split. (One-stage loops, AMD's, are not measured with fp8.)
    """
    return 1 if cfg.num_stages >= 2 and not kv_fp8 else 2


# ----------------------------------------------------------------------------- host side
@dataclasses.dataclass(frozen=True)
class DecodeCall:
    batch: int
    seqlen_q: int
    heads_kv: int
    group: int
    head_dim: int
    paged: bool
    page_size: int
    sm_scale: float
    softcap: float
    win_left: int
    win_right: int
    leftpad: bool = False  #: a per-sequence start key (``cache_leftpad``) is passed
    kv_fp8: bool = False  #: the cache is fp8, with ``(B, Hkv)`` fp32 ``k_descale``/``v_descale``
    sinks: bool = False  #: a ``(Hq,)`` float attention sink per query head is passed (``SINKS``)

    @functools.cached_property
    def block_m(self) -> int:
        return max(16, C.next_pow2(self.seqlen_q * self.group))

    @functools.cached_property
    def block_d(self) -> int:
        return max(16, C.next_pow2(self.head_dim))


@functools.lru_cache(maxsize=1024)
def _split_constexprs(call: DecodeCall, cfg: DecodeConfig, direct: bool = False, store_lse: bool = False,
                      fnuz_view: bool = False, fused_splits: int = 0, kv_aligned: bool = True,
                      whole_cache: bool = False) -> dict:
    """``fused_splits``: the split count of a launch whose last program per (sequence, K/V head) merges the
    splits itself (:data:`FUSED_COMBINE`); 0: the partials go to :func:`_decode_combine`. ``kv_aligned``:
    the K/V strides among :data:`~rocmflash.kernels.decode.kernel.LENGTH_ARGS` are multiples of 16 (:func:`length_values`). ``whole_cache``: no
    lengths are read, every sequence is the whole cache (:func:`launch` with ``seqlens=None``)."""
    return dict(HEAD_DIM=call.head_dim, BLOCK_M=call.block_m, BLOCK_N=cfg.BLOCK_N, BLOCK_D=call.block_d,
                PAGED=call.paged, WHOLE_PAGES=call.paged and call.page_size % cfg.BLOCK_N == 0,
                SOFTCAP=call.softcap > 0, BOUNDED_LEFT=call.win_left < M.UNBOUNDED,
                BOUNDED_RIGHT=call.win_right < M.UNBOUNDED, DIRECT=bool(direct), STORE_LSE=bool(store_lse),
                LEFTPAD=call.leftpad, KV_FP8=call.kv_fp8, FNUZ_VIEW=bool(fnuz_view), FUSED=bool(fused_splits),
                SPLITS_PAD=C.next_pow2(fused_splits) if fused_splits else 1, KV_ALIGNED=bool(kv_aligned),
                WHOLE_CACHE=bool(whole_cache), SINKS=call.sinks)


def length_values(call: DecodeCall, k_cache, v_cache, block_table) -> tuple:
    """The values of the split kernel's :data:`~rocmflash.kernels.decode.kernel.LENGTH_ARGS` for this cache, in that order."""
    sk, sv = k_cache.stride(), v_cache.stride()
    return _cache_extent(call, k_cache, block_table)[0], sk[0], sk[2], sv[0], sv[2]


def strides_aligned(lengths: tuple) -> bool:
    """Whether the strides among :func:`length_values` are all multiples of 16 (``KV_ALIGNED``)."""
    return all(v % 16 == 0 for v in lengths[1:])


def _length_class(lengths: tuple, k_cache, v_cache) -> tuple:
    """What else of the cache decides the split kernel's binary and specialised arguments (a launch key's scalars,
    beside ``loose_tensors`` K and V): each length value's integer width, ``KV_ALIGNED``, the other sizes/strides."""
    return (tuple(C.int_type(v) for v in lengths), strides_aligned(lengths), k_cache.shape[0],
            k_cache.shape[2:], k_cache.stride(1), k_cache.stride(3), v_cache.stride(1), v_cache.stride(3))


_KV_TENSORS = (1, 2)  #: where K and V sit in the split launch's tensors (their sizes: :func:`_length_class`)


def _lengths_of(keys: Optional[dict], call: DecodeCall, k_cache, v_cache, block_table) -> tuple:
    """``(length_values, strides_aligned, _length_class)`` of this cache; kept in the caller's ``keys`` (one
    signature: the same shapes and strides, so the same values) after the first call."""
    if keys is not None:
        kept = keys.get("lengths")
        if kept is not None:
            return kept
    lengths = length_values(call, k_cache, v_cache, block_table)
    found = lengths, strides_aligned(lengths), _length_class(lengths, k_cache, v_cache)
    if keys is not None:
        keys["lengths"] = found
    return found


def split_args(call: DecodeCall, q, k_cache, v_cache, block_table, seqlens, po, pl, num_splits: int,
               out=None, lse=None, leftpads=None, err=None, new_keys: int = 0, k_descale=None, v_descale=None,
               sem=None, sinks=None) -> dict:
    """The split kernel's arguments; ``out``/``lse`` are written directly when ``num_splits == 1``
    or by the last split of a fused launch (pass them then; otherwise the partial buffers ``po``/``pl``
    stand in for them, unused). ``sem``: a fused launch's int32 arrival counts (:func:`arrival_counts`;
    else ``seqlens`` stands in, unread).
    ``leftpads``: int32 ``(B,)`` start keys when ``call.leftpad`` (else ``seqlens`` stands in, unread).
    ``err``: the error word (:func:`error_word`; compile-only builds: any int32 stand-in);
    ``new_keys``: keys appended this call (a length below it is out of range); ``k_descale``/``v_descale``:
    the ``(B, Hkv)`` fp32 scales of an fp8 cache (``call.kv_fp8``; else ``seqlens`` stands in, unread);
    ``sinks``: the ``(Hq,)`` attention sinks when ``call.sinks`` (else ``seqlens`` stands in, unread)."""
    sq, sk, sv = q.stride(), k_cache.stride(), v_cache.stride()
    capacity, num_blocks = _cache_extent(call, k_cache, block_table)
    so = out.stride() if out is not None else (0, 0, 0, 0)
    softcap = float(call.softcap)
    ks = k_descale if k_descale is not None else seqlens
    vs = v_descale if v_descale is not None else seqlens
    sks, svs = (ks.stride(), vs.stride()) if call.kv_fp8 else ((0, 0), (0, 0))  # unread
    return dict(Q=q, K=k_cache, V=v_cache, BT=block_table, SEQLENS=seqlens,
                LEFTPADS=leftpads if leftpads is not None else seqlens, PO=po, PL=pl,
                O=out if out is not None else po, LSE=lse if lse is not None else pl,
                ERR=err if err is not None else seqlens, KS=ks, VS=vs, SEM=sem if sem is not None else seqlens,
                SINK=sinks if sinks is not None else seqlens,
                NUM_BLOCKS=num_blocks, CAPACITY=capacity,
                NEW_KEYS=int(new_keys),
                sm_scale=float(call.sm_scale), qk_scale=float(call.sm_scale) * C.LOG2E,
                softcap=softcap if softcap > 0 else 1.0,
                stride_qb=sq[0], stride_qt=sq[1], stride_qh=sq[2], stride_qd=sq[3],
                stride_kb=sk[0], stride_kn=sk[1], stride_kh=sk[2], stride_kd=sk[3],
                stride_vb=sv[0], stride_vn=sv[1], stride_vh=sv[2], stride_vd=sv[3],
                stride_ob=so[0], stride_ot=so[1], stride_oh=so[2], stride_od=so[3],
                stride_btb=block_table.stride(0) if call.paged else 0, stride_ksb=sks[0], stride_ksh=sks[1],
                stride_vsb=svs[0], stride_vsh=svs[1], stride_sh=sinks.stride(0) if call.sinks else 0,
                PAGE_SIZE=call.page_size if call.paged else 1,
                H_KV=call.heads_kv, GROUP=call.group, SEQ_Q=call.seqlen_q, NUM_SPLITS=num_splits,
                WIN_LEFT=call.win_left, WIN_RIGHT=call.win_right)


def _cache_extent(call: DecodeCall, k_cache, block_table) -> tuple[int, int]:
    """``(keys per sequence the cache holds, pages in the pool)`` (0 pages: contiguous); a compile-only
    build (tensor stand-ins without shapes) gets a 4096-key cache of 16 * 257 pages."""
    shape = getattr(k_cache, "shape", None)
    if shape is None:
        return 4096, (16 * 257 if call.paged else 0)
    if call.paged:
        return block_table.shape[1] * call.page_size, shape[0]
    return shape[1], 0


def combine_args(call: DecodeCall, po, pl, out, lse, num_splits: int) -> dict:
    so = out.stride()
    return dict(PO=po, PL=pl, O=out, LSE=lse, stride_ob=so[0], stride_ot=so[1], stride_oh=so[2], stride_od=so[3],
                H_KV=call.heads_kv, GROUP=call.group, SEQ_Q=call.seqlen_q, NUM_SPLITS=num_splits)


@functools.lru_cache(maxsize=1024)
def _combine_constexprs(call: DecodeCall, store_lse: bool, num_splits: int) -> dict:
    return dict(HEAD_DIM=call.head_dim, BLOCK_M=call.block_m, BLOCK_D=call.block_d,
                SPLITS_PAD=C.next_pow2(num_splits), STORE_LSE=bool(store_lse))


def launch(call: DecodeCall, q, k_cache, v_cache, block_table, seqlens, cfg: DecodeConfig, num_splits: int,
           out, lse=None, workspace: Optional[tuple] = None, keys: Optional[dict] = None,
           backend: Optional[str] = None, leftpads=None, new_keys: int = 0, k_descale=None, v_descale=None,
           sinks=None) -> None:
    """Run split + combine into ``out`` ``(B, Sq, Hq, D)`` (and ``lse`` ``(B, Hq, Sq)`` fp32 when given).

    With ``num_splits == 1`` the split kernel normalises and writes ``out``/``lse`` itself
    (one launch, no partial buffers; ``workspace`` is then unused).

    ``seqlens`` is int32 ``(B,)``: the key length of each sequence (cache + appended keys), or None: every
    sequence is the whole (unpaged) cache, and nothing is read for it (no ``(B,)`` tensor to fill per call);
    ``block_table`` an int32 ``(B, max_blocks)`` tensor when ``call.paged``, else any int32 tensor.
    ``workspace``: optional preallocated ``(partial_o, partial_lse)`` buffers of at least the
    sizes this call needs (reused by benchmarks; a fresh pair otherwise).

    ``keys``: a dict the caller keeps for calls of one ``call``, ``cfg`` and tensor dtypes, shapes, strides, device
    (and ROCm storage side of 2 GiB), where their launch keys are kept (``flash_attn_with_kvcache``: one per call
    signature); alignment, which fresh buffers can change, is checked on every call.
    ``backend``: :func:`rocmflash.kernels.common.torch_backend`'s answer when the caller has it.
    ``leftpads``: int32 ``(B,)`` first key of each sequence, required when ``call.leftpad``.
    ``new_keys``: keys appended to each sequence by this call (its length must be at least that).
    Values outside the cache (lengths, starts, pages) are replaced in the kernel by safe ones (a length clamped
    into ``new_keys..capacity``, a start into the sequence, page 0 for a page outside the pool, as the appends
    address the rows they then do not store) and raise bits of :func:`error_word` for ``q``'s device instead of
    addressing memory outside the cache; that sequence's output is undefined.
    ``k_descale``/``v_descale``: fp32 ``(B, Hkv)``, required exactly when ``call.kv_fp8`` (an fp8 cache
    holds ``k / k_descale``); a scale not finite and > 0 raises :data:`~rocmflash.kernels.decode.checks.BAD_DESCALE`.
    ``sinks``: ``(Hq,)`` float attention sinks (any float dtype and stride), required exactly when ``call.sinks``;
    a NaN or ``+inf`` sink raises :data:`~rocmflash.kernels.decode.checks.BAD_SINK`.

    The cache's length reaches the split kernel only through its unspecialised :data:`~rocmflash.kernels.decode.kernel.LENGTH_ARGS`: a cache one key
    longer each call replays one launch plan per split count, never Triton's JIT launch.
    """
    import torch
    backend = backend or C.torch_backend()
    kcfg = cfg.kernel_config()
    lse_arg = lse if lse is not None else C.dummy_lse(q.device)
    if call.leftpad != (leftpads is not None):
        raise ValueError("leftpads must be given exactly when the DecodeCall has leftpad=True")
    if call.sinks != (sinks is not None):
        raise ValueError("sinks must be given exactly when the DecodeCall has sinks=True")
    err = error_word(q.device)
    whole = seqlens is None
    if whole:
        if call.paged or new_keys:
            raise ValueError("seqlens=None (the whole cache) needs an unpaged cache and no appended keys")
        seqlens = err  # any int32 tensor on the device stands in, unread
    if block_table is None and not call.paged:
        block_table = seqlens  # unread
    starts = leftpads if leftpads is not None else seqlens  # unread without leftpad
    k_cache, v_cache, ks, vs, fnuz_view = KQ.launch_views(call.kv_fp8, k_cache, v_cache, k_descale, v_descale, seqlens)
    sink_arg = sinks if sinks is not None else seqlens  # unread without sinks
    lengths, aligned, length_class = _lengths_of(keys, call, k_cache, v_cache, block_table)
    if num_splits == 1:  # the split kernel writes the output itself: no partial buffers, no combine
        scalars = (call, cfg, 1, lse is not None, new_keys, length_class, whole)
        tensors = (q, k_cache, v_cache, block_table, seqlens, starts, out, lse_arg, err, ks, vs, sink_arg)
        C.launch_cached(_decode_split, scalars, tensors,
                        lambda: ((1, call.batch * call.heads_kv),
                                 split_args(call, q, k_cache, v_cache, block_table, seqlens, out, lse_arg, 1,
                                            out, lse_arg, starts, err, new_keys, ks, vs, sinks=sinks),
                                 _split_constexprs(call, cfg, True, lse is not None, fnuz_view, 0, aligned, whole)),
                        kcfg, backend, C.kept_key(keys, ("direct", lse is not None, backend, new_keys, whole),
                                                  _decode_split, scalars, tensors, kcfg, backend, _KV_TENSORS),
                        loose=lengths, loose_tensors=_KV_TENSORS)
        return
    rows = call.batch * call.heads_kv * num_splits
    fused = fuses_merge(FUSED_COMBINE, backend, q.is_cuda, 2 * k_cache.numel() * k_cache.element_size()) \
        and not EW.capturing(q.device)
    if workspace is None:
        po = torch.empty(rows * call.block_m * call.block_d, dtype=torch.float32, device=q.device)
        pl = torch.empty(rows * call.block_m, dtype=torch.float32, device=q.device)
    else:
        po, pl = workspace
    # the split launch; fused, its last program per (sequence, K/V head) also merges into out/lse (no combine)
    sem = arrival_counts(q.device, call.batch * call.heads_kv) if fused else None
    merged = (out, lse_arg, sem) if fused else ()  # what a fused launch writes and counts with
    scalars = (call, cfg, num_splits, new_keys, length_class, whole) + ((lse is not None, "fused") if fused else ())
    tensors = (q, k_cache, v_cache, block_table, seqlens, starts, po, pl, err, ks, vs, sink_arg) + merged
    slot = ("fused", num_splits, lse is not None) if fused else ("split", num_splits)
    C.launch_cached(_decode_split, scalars, tensors,
                    lambda: ((num_splits, call.batch * call.heads_kv),
                             split_args(call, q, k_cache, v_cache, block_table, seqlens, po, pl, num_splits,
                                        *merged[:2], leftpads=starts, err=err, new_keys=new_keys, k_descale=ks,
                                        v_descale=vs, sem=sem, sinks=sinks),
                             _split_constexprs(call, cfg, False, fused and lse is not None, fnuz_view,
                                               num_splits if fused else 0, aligned, whole)), kcfg, backend,
                    C.kept_key(keys, slot + (backend, new_keys, whole), _decode_split, scalars, tensors, kcfg,
                               backend, _KV_TENSORS), loose=lengths, loose_tensors=_KV_TENSORS)
    if fused:
        return
    scalars = (call, num_splits, lse is not None)
    tensors = (po, pl, out, lse_arg)
    combine_cfg = _kernel_config(16, 4, 1, 0)
    C.launch_cached(_decode_combine, scalars, tensors,
                    lambda: ((call.batch * call.heads_kv, call.seqlen_q * call.group),
                             combine_args(call, po, pl, out, lse_arg, num_splits),
                             _combine_constexprs(call, lse is not None, num_splits)),
                    combine_cfg, backend, C.kept_key(keys, ("combine", num_splits, lse is not None, backend),
                                                     _decode_combine, scalars, tensors, combine_cfg, backend))


class _StridedPtr(C.Ptr):
    def __init__(self, ty: str, strides: tuple, nbytes: int = 0):
        super().__init__(ty, nbytes)
        self._strides = tuple(strides)

    def stride(self, dim=None):
        return self._strides if dim is None else self._strides[dim]


def compile_for(target, cfg: DecodeConfig, head_dim: int = 128, dtype: str = "bf16", group: int = 8,
                seqlen_q: int = 1, paged: bool = False, page_size: int = 256, causal: bool = True,
                softcap: bool = False, window: bool = False, leftpad: bool = False, cache_bytes: int = 0,
                q_bytes: int = 0, kv_dtype: str = "", fused: bool = False, whole_cache: bool = False,
                sinks: bool = False):
    """Cross-compile ``(split, combine)`` for ``target`` without tensors (contiguous strides of a
    ``(B, S_max, 8, D)`` cache or a paged one, ``B=8``, as a launch would specialise them);
    ``leftpad``: the left-padded build (``cache_leftpad``).

    ``cache_bytes``: the storage of each K and V cache (or page pool) the build stands for,
    ``q_bytes`` that of ``q`` and the output (0: well under 2 GiB). On AMD a tensor past 2 GiB
    is read with global loads instead of buffer loads (another binary, other registers), so a
    build for a large cache must be told its size. ``kv_dtype``: an fp8 cache's Triton type
    (``fp8e4b8``/``fp8e5b16`` FNUZ on gfx942, ``fp8e4nv``/``fp8e5`` OCP on gfx950 and sm_89+; checked
    against the target) with fp32 descales; "" (default): the cache is ``dtype``. ``fused``: the split kernel
    that merges its splits itself (:data:`FUSED_COMBINE`); the combine kernel is built all the same. ``whole_cache``:
    the build that reads no lengths (every sequence the whole cache: a call without ``cache_seqlens``). ``sinks``:
    the build that joins fp32 attention sinks (``s_aux``)."""
    for name, value in (("cache_bytes", cache_bytes), ("q_bytes", q_bytes)):
        if type(value) is not int or value < 0:
            raise ValueError(f"compile_for: {name} {value!r} is invalid; expected an int >= 0")
    hkv, smax = 8, 4096
    call = DecodeCall(8, seqlen_q, hkv, group, head_dim, paged, page_size, 0.125, 30.0 if softcap else 0.0,
                      256 if window else M.UNBOUNDED, 0 if causal else M.UNBOUNDED, leftpad, bool(kv_dtype), sinks)
    t = "*" + dtype
    hq = hkv * group
    q = _StridedPtr(t, (seqlen_q * hq * head_dim, hq * head_dim, head_dim, 1), q_bytes)
    rows = page_size if paged else smax
    kv = _StridedPtr("*" + KQ.check_kv_type(kv_dtype, target) if kv_dtype else t,
                     (rows * hkv * head_dim, hkv * head_dim, head_dim, 1), cache_bytes)
    scales = _StridedPtr("*fp32", (hkv, 1)) if kv_dtype else None
    bt = _StridedPtr("*i32", (smax // max(1, page_size), 1))
    f32 = _StridedPtr("*fp32", (1,))
    splits = 4
    kcfg = cfg.kernel_config()
    main = C.compile_kernel(_decode_split, target,
                            split_args(call, q, kv, kv, bt, _StridedPtr("*i32", (1,)), f32, f32, splits,
                                       q if fused else None, f32 if fused else None,
                                       leftpads=_StridedPtr("*i32", (1,)) if leftpad else None, k_descale=scales,
                                       v_descale=scales, sem=_StridedPtr("*i32", (1,)) if fused else None,
                                       sinks=_StridedPtr("*fp32", (1,)) if sinks else None),
                            _split_constexprs(call, cfg, False, fused, False, splits if fused else 0,
                                              strides_aligned(length_values(call, kv, kv, bt)), whole_cache), kcfg)
    combine = C.compile_kernel(_decode_combine, target, combine_args(call, f32, f32, q, f32, splits),
                               _combine_constexprs(call, True, splits), _kernel_config(16, 4, 1, 0))
    return main, combine


__all__ = ["DecodeConfig", "DecodeCall", "default_decode_config", "choose_num_splits", "programs_per_cu", "launch", "compile_for",
           "KERNELS"]
