"""``rocmflash tune --mode decode``: tune the KV-cache decode kernels (split-KV + combine).

Same shape as the forward tune: the config space (``BLOCK_N``, warps, stages, AMD
``waves_per_eu``) is cross-compiled for the target arch on the CPU and pruned on compiler
truth (:mod:`rocmflash.static.prune`: spills, LDS, occupancy, duplicate binaries); only on the
live GPU are the survivors gated against an fp32 reference and timed, each at every split
count of :func:`split_choices` (a launch argument: one binary serves all). Decode problems
are small and cheap to time, so every survivor is measured -- no ranking decides alone.

Database entries live in the GPU's config database under keys
``decode-d{D}-{dtype}-gqa{G}-kv{bucket}-b{batch bucket}[-p{page size}][-kv{fp8 format}]`` (buckets:
next power of two; the last part for an fp8 cache, ``--kv-dtype fp8``: ``-kvfp8e4m3fnuz`` on gfx942,
``-kvfp8e4m3fn`` on gfx950 and sm_89+, so entries of a 16-bit and an fp8 cache of one problem
coexist) with ``"mode": "decode"``; forward lookups skip them. At run time
:func:`rocmflash.db.lookups.decode.lookup_decode` serves the measured entry of the same head dim, dtype, GQA ratio
and cache format (and page size) with the nearest KV-length bucket, then the nearest batch bucket.

An fp8 cache (:attr:`DecodeProblem.kv_dtype`) is timed as ``flash_attn_with_kvcache`` reads one: the
cache holds fp8 values of random K/V quantised with fp32 ``(B, Hkv)`` descales, the gate's reference is
fp32 attention over the *dequantised* cache (the kernel widens fp8 to 16 bits exactly, so the gate,
:func:`rocmflash.measure.gate`, keeps the 16-bit tolerance of q's dtype: :func:`measure_decode` says why), and
the entry's bytes read (``kv_gbs``) count one byte per element.
Without a live GPU of the named kind, the static #1 is written with ``"measured": false``
and ``num_splits = 0`` (chosen per call), and never served.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

from rocmflash.config import normalize_dtype
from rocmflash.db import FP8_KEY_DTYPES
# the entry keys and the run-time lookup live on the run-time side (rocmflash.db.lookups.decode)
from rocmflash.db.lookups.decode import decode_key
from rocmflash.static.families import FamilyStatic, family_rows
from rocmflash.tuning.decode_kv import kv_format, kv_name


# ----------------------------------------------------------------------------- problem
@dataclasses.dataclass(frozen=True)
class DecodeProblem:
    """One decode step to tune: ``batch`` sequences of ``seqlen_k`` cached keys, ``seqlen_q`` new tokens."""

    head_dim: int = 128
    dtype: str = "bf16"
    heads_q: int = 32
    heads_kv: int = 8
    batch: int = 32
    seqlen_k: int = 4096
    seqlen_q: int = 1
    page_size: int = 0  #: 0: contiguous cache
    #: the cache's format: "" (``dtype``'s), an fp8 format's key name (``fp8e4m3fnuz``, ``fp8e4m3fn``, ...), or
    #: before :meth:`for_gpu` one of ``--kv-dtype``'s names (``fp8``, ``fp8_e4m3``, ``fp8_e5m2``; ``auto`` is "")
    kv_dtype: str = ""

    def validate(self) -> "DecodeProblem":
        if not 16 <= self.head_dim <= 256:
            raise ValueError(f"--head-dim {self.head_dim} is invalid; expected 16..256")
        if self.heads_kv < 1 or self.heads_q % self.heads_kv:
            raise ValueError(f"--heads {self.heads_q} must be a multiple of --kv-heads {self.heads_kv}")
        for name, value in (("--batch", self.batch), ("--seqlen", self.seqlen_k), ("--seqlen-q", self.seqlen_q)):
            if value < 1:
                raise ValueError(f"{name} {value} is invalid; expected >= 1")
        if self.page_size < 0:
            raise ValueError(f"--page-size {self.page_size} is invalid; expected >= 0 (0 = contiguous)")
        object.__setattr__(self, "dtype", normalize_dtype(self.dtype))
        object.__setattr__(self, "kv_dtype", kv_name(self.kv_dtype))
        return self

    def for_gpu(self, gpu) -> "DecodeProblem":
        """This problem with ``--kv-dtype fp8``/``fp8_e4m3``/``fp8_e5m2`` resolved to ``gpu``'s format (FNUZ on
        gfx942, OCP on gfx950/sm_89+); ``ValueError`` naming the arch when it has no fp8 (gfx90a)."""
        return dataclasses.replace(self, kv_dtype=kv_format(self.kv_dtype, gpu))

    @property
    def kv_torch_dtype(self):
        """The cache's torch fp8 dtype, or None for a 16-bit cache."""
        import torch

        if not self.kv_dtype:
            return None
        if self.kv_dtype not in FP8_KEY_DTYPES.values():
            raise ValueError(f"kv_dtype {self.kv_dtype!r} names no format yet: resolve it for a GPU (for_gpu)")
        return getattr(torch, next(t for t, k in FP8_KEY_DTYPES.items() if k == self.kv_dtype))

    @property
    def kv_itemsize(self) -> int:
        return 1 if self.kv_dtype else 2

    @property
    def group(self) -> int:
        return self.heads_q // self.heads_kv

    def to_dict(self) -> dict:
        """The fields; ``kv_dtype`` only for an fp8 cache (a 16-bit problem's dict, its compile-cache and journal
        key, is what it was before fp8 caches)."""
        out = dataclasses.asdict(self)
        if not self.kv_dtype:
            del out["kv_dtype"]
        return out

    def static_problem(self) -> "DecodeProblem":
        """The compile-only problem: one sequence of 4096 cached keys where this problem's cache and queries are
        under the 2 GiB line, else this problem. A build depends on the batch and the cached length only through
        the storage past that line (:func:`compile_task`), so the buckets of a model share one static phase (and
        one compile-cache entry per config) instead of compiling the same binaries once per bucket."""
        from rocmflash.tuning.live_gate import build_bytes

        if build_bytes(self.cache_bytes()) or build_bytes(self.q_bytes()):
            return self
        return dataclasses.replace(self, batch=1, seqlen_k=4096)

    def key(self) -> str:
        return decode_key(self.head_dim, self.dtype, self.group, self.seqlen_k, self.batch, self.page_size,
                          self.kv_dtype)

    def kv_bytes(self) -> int:
        """Bytes of K and V one step reads: ``2 * B * L * Hkv * D * (2, or 1 for an fp8 cache)``."""
        return 2 * self.batch * self.seqlen_k * self.heads_kv * self.head_dim * self.kv_itemsize

    def cache_bytes(self) -> int:
        """Storage of one K (or V) cache tensor as the tune allocates it: ``(B, L, Hkv, D)``, or the
        pool of ``B * ceil(L / page_size)`` whole pages when paged."""
        rows = -(-self.seqlen_k // self.page_size) * self.page_size if self.page_size else self.seqlen_k
        return self.kv_itemsize * self.batch * rows * self.heads_kv * self.head_dim

    def q_bytes(self) -> int:
        """Storage of ``q`` (and of the output): ``(B, Sq, Hq, D)`` in a 2-byte dtype."""
        return 2 * self.batch * self.seqlen_q * self.heads_q * self.head_dim


# ----------------------------------------------------------------------------- space and compile
def decode_space(arch: str) -> list:
    """The decode configs for an arch, as :class:`~rocmflash.kernels.decode.host.DecodeConfig` dicts."""
    amd = arch.startswith("gfx")
    stages = (1, 2) if amd else (1, 2, 3, 4)
    waves = (0, 1, 2, 4) if amd else (0,)
    return [dict(BLOCK_N=bn, num_warps=w, num_stages=s, waves_per_eu=wpe, num_splits=0)
            for bn in (16, 32, 64, 128) for w in (1, 2, 4, 8) for s in stages for wpe in waves
            if not (bn == 16 and w == 8)]


def task_compile_options(config: dict, backend: str) -> dict:
    from rocmflash.kernels.decode.host import DecodeConfig

    return DecodeConfig.from_dict(config).kernel_config().compile_options(backend)


def compile_task(target, config: dict, problem: dict):
    """Family entry for :func:`rocmflash.static.compile.sweep_family`: both decode kernels for ``target``, told the
    storage of the problem's cache (or page pool) and queries where it is past the 2 GiB line (on AMD
    those are read with global loads, not buffer loads: another binary)."""
    from rocmflash.kernels.decode.host import DecodeConfig, compile_for
    from rocmflash.tuning.live_gate import build_bytes

    from rocmflash.hw.fp8 import triton_type

    p = DecodeProblem(**problem)
    return compile_for(target, DecodeConfig.from_dict(config), p.head_dim, p.dtype, p.group, p.seqlen_q,
                       paged=p.page_size > 0, page_size=p.page_size or 256, causal=True,
                       cache_bytes=build_bytes(p.cache_bytes()), q_bytes=build_bytes(p.q_bytes()),
                       kv_dtype=triton_type(p.kv_torch_dtype) if p.kv_dtype else "")


def _static_key(config: dict, obs: dict, index: int) -> tuple:
    """Static order (smaller first): occupancy, then fewer registers, then larger key blocks.

    Decode streams K/V: resident waves hide memory latency, so occupancy comes first.
    """
    k = obs["kernels"][0] if obs.get("kernels") else {}
    return (-(k.get("waves_per_simd") or 0), k.get("allocated_vgprs") or k.get("vgpr_count") or 10**6,
            -config["BLOCK_N"], index)


def static_phase(gpu, problem: DecodeProblem, cache_dir=None, workers=None, settings=None,
                 configs: Optional[list] = None, on_configs=None, on_result=None) -> FamilyStatic:
    """Cross-compile the decode space for ``gpu``'s arch, prune, rank (no GPU); rows also carry the combine kernel's
    summary (``"combine"``). Streamed: ``on_configs(configs)`` first, ``on_result(observation)`` as each arrives."""
    from rocmflash.static.compile import sweep_family
    from rocmflash.static.prune import PruneSettings, prune

    configs = configs if configs is not None else decode_space(gpu.arch)
    if on_configs is not None:
        on_configs(configs)
    observations, stats = sweep_family("decode", configs, problem.static_problem().to_dict(), gpu, cache_dir,
                                       workers, on_result=on_result)
    rows = family_rows(configs, observations, prune(observations, settings or PruneSettings()), _static_key)
    for row, obs in zip(rows, observations):
        row["combine"] = obs["kernels"][1] if len(obs.get("kernels") or ()) > 1 else {}
    return FamilyStatic(problem, rows, stats)


__all__ = ["DecodeProblem", "decode_key", "decode_space", "static_phase"]


# ----------------------------------------------------------------------------- live phase (worker side)
def split_choices(problem: DecodeProblem, cfg, compute_units: int) -> list:
    """Split counts timed for the :class:`~rocmflash.kernels.decode.host.DecodeConfig` ``cfg``: powers of
    two up to 64 and the run-time heuristic's own choice for it, at most one split per key block.
    The pre-warm and the timing worker both call this, so they compile and time the same counts."""
    from rocmflash.kernels.decode.host import choose_num_splits, programs_per_cu

    block_n = cfg.BLOCK_N
    blocks = max(1, -(-problem.seqlen_k // block_n))
    auto = choose_num_splits(problem.batch, problem.heads_kv, problem.seqlen_k, block_n, compute_units,
                             programs_per_cu(cfg, bool(problem.kv_dtype)))  # as flash_attn_with_kvcache chooses
    return sorted({s for s in (1, 2, 4, 8, 16, 32, 64, auto) if s <= blocks})


_INPUTS: dict = {}


def _decode_inputs(p: DecodeProblem, device):
    """q, caches (with a shuffled block table when paged; an fp8 cache with its descales ``ks``/``vs``,
    :func:`rocmflash.tuning.decode_kv.fp8_caches`), lengths and a cache flush buffer; kept per problem."""
    import torch

    from rocmflash.measure import flush_buffer

    if _INPUTS.get("problem") != p:
        _INPUTS.clear()
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[p.dtype]
        gen = torch.Generator(device=device).manual_seed(0)
        q = torch.randn(p.batch, p.seqlen_q, p.heads_q, p.head_dim, device=device, dtype=dtype, generator=gen)
        if p.page_size:
            pages = -(-p.seqlen_k // p.page_size)
            shape = (p.batch * pages, p.page_size, p.heads_kv, p.head_dim)
            table = torch.randperm(p.batch * pages, device=device, generator=gen).view(p.batch, pages).to(torch.int32)
        else:
            shape, table = (p.batch, p.seqlen_k, p.heads_kv, p.head_dim), None
        if p.kv_dtype:
            from rocmflash.tuning.decode_kv import fp8_caches

            k, v, ks, vs = fp8_caches(shape, p.batch, p.heads_kv, p.kv_torch_dtype, device, gen)
        else:
            k = torch.randn(shape, device=device, dtype=dtype, generator=gen)
            v = torch.randn(shape, device=device, dtype=dtype, generator=gen)
            ks = vs = None
        lens = torch.full((p.batch,), p.seqlen_k, dtype=torch.int32, device=device)
        flush = flush_buffer(device)
        _INPUTS.update(problem=p, q=q, k=k, v=v, ks=ks, vs=vs, table=table, lens=lens, flush=flush)
    return _INPUTS


#: most copies (small caches: 8 MB at B=1, 2k keys, 8 K/V heads of 128)
MAX_COLD_COPIES = 64


def _cold_copies(inp) -> list:
    """``[(k, v), ...]``: the problem's caches plus copies, together at least the cache flush of the device
    (:func:`rocmflash.measure.device_flush_bytes`: twice its largest cache; each copy a layer's own
    cache in a model: a timed call never finds the previous call's keys in the cache)."""
    from rocmflash.measure import device_flush_bytes

    k, v = inp["k"], inp["v"]
    if "copies" not in inp:
        per_copy = 2 * k.numel() * k.element_size()
        count = min(MAX_COLD_COPIES, max(1, -(-device_flush_bytes(k.device) // per_copy)))
        inp["copies"] = [(k, v)] + [(k.clone(), v.clone()) for _ in range(count - 1)]
    return inp["copies"]


def _reference(inp, p: DecodeProblem, rows: int):
    """fp32 attention of the first ``rows`` sequences (non-causal over every cached key; an fp8 cache dequantised)."""
    import torch

    from rocmflash.tuning.decode_kv import dequantised

    outs = []
    for b in range(rows):
        if inp["table"] is not None:
            idx = torch.arange(p.seqlen_k, device=inp["q"].device)
            phys = inp["table"][b][idx // p.page_size].long()
            k, v = inp["k"][phys, idx % p.page_size], inp["v"][phys, idx % p.page_size]
        else:
            k, v = inp["k"][b], inp["v"][b]
        if inp["ks"] is not None:
            k, v = dequantised(k, inp["ks"][b]), dequantised(v, inp["vs"][b])
        q = inp["q"][b].float().transpose(0, 1)  # (Hq, Sq, D)
        k = k.float().repeat_interleave(p.group, 1).transpose(0, 1)
        v = v.float().repeat_interleave(p.group, 1).transpose(0, 1)
        s = q @ k.transpose(1, 2) / math.sqrt(p.head_dim)
        outs.append((torch.softmax(s, -1) @ v).transpose(0, 1))
    return torch.stack(outs)


def measure_decode(task: dict) -> dict:
    """Gate one decode config, then time it at every split count (runs in the live worker)."""
    import torch

    from rocmflash.kernels.decode import host as KD
    from rocmflash.messages import error_line
    from rocmflash.kernels.common import interpreting, num_compute_units
    from rocmflash.measure import gate, graph_replay_ms, time_flushed

    p = DecodeProblem(**task["problem"])
    result = {"config": task["config"], "status": "failed", "error": None, "times_ms": {}}
    try:
        cfg = KD.DecodeConfig.from_dict(task["config"])
        device = torch.device("cpu" if interpreting() else "cuda")
        inp = _decode_inputs(p, device)
        call = KD.DecodeCall(p.batch, p.seqlen_q, p.heads_kv, p.group, p.head_dim, p.page_size > 0,
                             p.page_size, 1 / math.sqrt(p.head_dim), 0.0, (1 << 30), (1 << 30), kv_fp8=bool(p.kv_dtype))
        table = inp["table"] if inp["table"] is not None else inp["lens"]
        out = torch.empty_like(inp["q"])
        splits = split_choices(p, cfg, num_compute_units(device))

        def run(n, k=inp["k"], v=inp["v"]):
            KD.launch(call, inp["q"], k, v, table, inp["lens"], cfg, n, out, k_descale=inp["ks"], v_descale=inp["vs"])

        rows = min(p.batch, 2)
        reference = {"out": [(slice(None, rows), _reference(inp, p, rows))]}
        inputs = {n: inp[n] for n in ("q", "k", "v", "ks", "vs", "table", "lens") if inp[n] is not None}
        for n in (splits[0], splits[-1]):  # the gate: fewest and most splits
            # the bound of q's dtype, for an fp8 cache too: the kernel widens fp8 to fp16 exactly and never rounds
            # P to fp8 (the reason the fp8 forward gets V's unit roundoff, 2**-4), and the reference dequantises
            # the very cache timed, so a correct config's error is a 16-bit kernel's (interpreter, D=64, 256 keys:
            # 2.4e-4 with fp16 q, 3.1e-3 with bf16 q, as a 16-bit cache's 2.6e-4 / 5.0e-3): fp8's bound would let
            # a wrong descale of a few % pass
            verdict = gate(lambda n=n: run(n), reference, {"out": out}, inputs, p.dtype)
            if not verdict.passed:
                if verdict.inputs_written:
                    _INPUTS.clear()
                result.update(status="incorrect", error=f"{verdict.why} at num_splits={n}")
                return result
        if inp["flush"] is None:  # the interpreter: wall clock of one call, never a GPU time
            for n in splits:
                result["times_ms"][str(n)] = time_flushed(lambda n=n: run(n), None, 1)
        else:
            caches = _cold_copies(inp)
            for n in splits:
                fns = [lambda n=n, k=k, v=v: run(n, k, v) for k, v in caches]
                result["times_ms"][str(n)] = graph_replay_ms(fns, max(len(fns), task.get("calls", 8)))
        result["timing"] = "graph" if inp["flush"] is not None else "interpreter"
        result["status"] = "ok"
    except Exception as err:  # compile error, out of resources, launch failure
        result["error"] = error_line(err)
    return result


def prewarm_specs(p: DecodeProblem) -> dict:
    """The pre-warm's stand-ins ``{"q", "out", "k", "v": (dims, bytes of the timed tensor)}``: one sequence
    with the problem's cache strides (paged: its own pages), each standing for the tensor of the whole
    batch, whose side of the 2 GiB line it keeps (:func:`rocmflash.tuning.live_gate.stand_ins`)."""
    q = ((1, p.seqlen_q, p.heads_q, p.head_dim), p.q_bytes())
    rows = (-(-p.seqlen_k // p.page_size), p.page_size) if p.page_size else (1, p.seqlen_k)
    kv = ((*rows, p.heads_kv, p.head_dim), p.cache_bytes())
    return {"q": q, "out": q, "k": kv, "v": kv}


def partial_specs(p: DecodeProblem, call, num_splits: int, real_splits: int) -> dict:
    """The split kernel's fp32 partial buffers ``{"po", "pl": (dims, bytes of the timed buffer)}`` of a
    one-sequence launch at ``num_splits`` standing for the problem's at ``real_splits`` (their sizes
    follow :func:`rocmflash.kernels.decode.host.launch`)."""
    own, real = p.heads_kv * num_splits, p.batch * p.heads_kv * real_splits
    return {"po": ((own * call.block_m * call.block_d,), 4 * real * call.block_m * call.block_d),
            "pl": ((own * call.block_m,), 4 * real * call.block_m)}


def prewarm_launches(p: DecodeProblem, call, splits) -> list:
    """``[(num_splits, real split count), ...]``: one pre-warm launch per binary the timed split counts
    run -- per specialisation of the count (Triton makes ``== 1`` a constant and marks multiples of
    16) and, with partial buffers, per side of the 2 GiB line the timed buffers are on."""
    from rocmflash.tuning.live_gate import beyond_32bit_range

    launches = {}
    for s in sorted(splits):
        n = 1 if s == 1 else (16 if s % 16 == 0 else 2)
        sides = () if n == 1 else tuple(beyond_32bit_range(real) for _, real in
                                        partial_specs(p, call, n, s).values())
        launches.setdefault((n, sides), (n, s))
    return list(launches.values())


def prewarm_decode(task: dict) -> Optional[str]:
    """Build one config's binaries at the problem's specialisation (runs in a pre-warm worker).

    One launch per binary of :func:`prewarm_launches`, on one sequence with the problem's cache
    strides and each tensor on the timed tensor's side of the 2 GiB line (:func:`prewarm_specs`,
    :func:`partial_specs`), so the timing worker finds every binary in Triton's cache. Returns
    None or the error.
    """
    import torch

    from rocmflash.kernels.decode import host as KD
    from rocmflash.messages import error_line
    from rocmflash.tuning.live_gate import pads_storage, stand_ins

    p = DecodeProblem(**task["problem"])
    try:
        cfg = KD.DecodeConfig.from_dict(task["config"])
        dev, pad = torch.device("cuda"), pads_storage()
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[p.dtype]
        specs = prewarm_specs(p)
        if p.kv_dtype:  # an fp8 cache: its own stand-ins (one byte an element) and descales
            t = stand_ins({n: specs[n] for n in ("q", "out")}, dtype, dev, pad)
            t.update(stand_ins({n: specs[n] for n in ("k", "v")}, p.kv_torch_dtype, dev, pad))
            ks = vs = torch.ones(1, p.heads_kv, dtype=torch.float32, device=dev)
        else:
            t, ks, vs = stand_ins(specs, dtype, dev, pad), None, None
        call = KD.DecodeCall(1, p.seqlen_q, p.heads_kv, p.group, p.head_dim, p.page_size > 0, p.page_size,
                             1 / math.sqrt(p.head_dim), 0.0, (1 << 30), (1 << 30), kv_fp8=bool(p.kv_dtype))
        lens = torch.full((1,), p.seqlen_k, dtype=torch.int32, device=dev)
        pages = t["k"].shape[0] if p.page_size else 0
        table = torch.randperm(pages, device=dev).view(1, pages).to(torch.int32) if p.page_size else lens
        for n, real in prewarm_launches(p, call, task["splits"]):
            ws = None if n == 1 else stand_ins(partial_specs(p, call, n, real), torch.float32, dev, pad)
            KD.launch(call, t["q"], t["k"], t["v"], table, lens, cfg, n, t["out"],
                      workspace=None if ws is None else (ws["po"], ws["pl"]), k_descale=ks, v_descale=vs)
        torch.cuda.synchronize()
        return None
    except Exception as err:
        return error_line(err, 200)
