"""``flash_attn_with_kvcache``'s per-signature plans (:mod:`rocmflash.api.decode`) and kept launch keys, on the CPU.

A plan (metadata checks, DecodeCall, config, split count, launch keys) is kept from a
signature's second call on. These tests check that any change of what the checks or the
launches read -- shape, dtype, strides, page size, options, split count, backend storage
class -- gets a plan of its own, equal to what the checked path decides; that bad input
after a kept plan still raises before the cache is written; that replayed launches pass
what a fresh launch would; and that :func:`rocmflash.api.decode.clear_cache` makes a new
database entry seen. No kernel runs: Triton's launcher is recorded instead (as in
``test_launch_cache.py``) and CPU tensors pass decode's device check.
"""

import pytest
import torch

from rocmflash.api import decode as Dm
from rocmflash.kernels import common as C
from rocmflash.kernels import launch as L
from rocmflash.kernels.decode import host as KD
from rocmflash.kernels.decode import kernel as DK


class _FakeCompiled:
    """Stands in for Triton's CompiledKernel: ``compiled[grid](*args)`` records a replay."""

    def __init__(self, log, name):
        self.log, self.name = log, name

    def __getitem__(self, grid):
        return lambda *args: self.log.append(("replay", self.name, grid, args))


@pytest.fixture
def fake_triton(monkeypatch):
    """Compiled-launch path on CPU tensors: first launches and replays are recorded, nothing runs."""
    log = []

    def jit_launch(fn, grid, kwargs):
        log.append(("jit", fn.__name__, tuple(grid) + (1,) * (3 - len(grid)),
                    tuple(kwargs[name] for name in fn.arg_names)))
        return _FakeCompiled(log, fn.__name__)

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(L, "interpreting", lambda: False)
    monkeypatch.setattr(Dm, "_interpreting", lambda: True)  # CPU tensors pass the device check
    monkeypatch.setattr(L, "FAST_LAUNCH", True)
    monkeypatch.setattr(L, "_jit_launch", jit_launch)
    monkeypatch.setattr(L, "_is_compiled_kernel", lambda obj: isinstance(obj, _FakeCompiled))
    monkeypatch.setattr(L, "_PLANS", {})
    Dm.clear_cache()
    yield log
    Dm.clear_cache()


def _inputs(B=2, capacity=256, Hkv=2, group=2, D=32, dtype=torch.float16, page=0, new=1, seed=0):
    """Decode arguments: zeroed caches (pages in order when paged), lengths 3 and 10, ``new`` keys to append."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, max(new, 1), Hkv * group, D, generator=gen).to(dtype)
    if page:
        kc = torch.zeros(B * capacity // page, page, Hkv, D, dtype=dtype)
        table = torch.arange(B * capacity // page, dtype=torch.int32).view(B, -1)
    else:
        kc, table = torch.zeros(B, capacity, Hkv, D, dtype=dtype), None
    k = torch.randn(B, new, Hkv, D, generator=gen).to(dtype) if new else None
    v = torch.randn(B, new, Hkv, D, generator=gen).to(dtype) if new else None
    lens = torch.tensor([3, 10][:B], dtype=torch.int32)
    return dict(q=q, k_cache=kc, v_cache=kc.clone(), k=k, v=v, cache_seqlens=lens, block_table=table)


def _plans():
    """The kept plans, each once (a plan of a cache read as a whole is kept under its signature with and without
    the cache's length)."""
    return list({id(p): p for p in Dm._CALL_PLANS.values()}.values())


def _fresh_plan(args: dict, opts: dict) -> "Dm._Plan":
    """What the checked path decides for these arguments (no plan kept)."""
    o = dict(softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, num_splits=0, return_lse=False)
    o.update(opts)
    return Dm._make_plan(args["q"], args["k_cache"], args["v_cache"], args["k"], args["v"], args["cache_seqlens"],
                         args["block_table"], o["softmax_scale"], o["causal"], o["window_size"], o["softcap"],
                         o["num_splits"], bool(o["return_lse"]), C.torch_backend(),
                         per_length=Dm._per_length(args["block_table"], args["k"], args["cache_seqlens"]))


def test_a_plan_is_kept_from_the_second_call_and_reused(fake_triton):
    Dm.flash_attn_with_kvcache(**_inputs(seed=1))
    assert _plans() == []  # seen once: nothing kept (a cache growing each call never repeats a signature)
    Dm.flash_attn_with_kvcache(**_inputs(seed=2))
    (plan,) = _plans()
    assert plan.launch_keys is not None
    for seed in (3, 4):  # new tensors, same metadata
        Dm.flash_attn_with_kvcache(**_inputs(seed=seed))
        assert len(_plans()) == 1 and _plans()[0] is plan
    assert plan[:-1] == _fresh_plan(_inputs(), {})[:-1]
    Dm.clear_cache()
    assert _plans() == [] and not Dm._SEEN


_CHANGES = {  # name: (input changes, option changes), each a new signature next to the base call's
    "capacity": (dict(capacity=320), {}),
    "dtype": (dict(dtype=torch.bfloat16), {}),
    "head dim": (dict(D=64), {}),
    "GQA group": (dict(group=4), {}),
    "batch": (dict(B=1), {}),
    "new tokens": (dict(new=3), {}),
    "no append": (dict(new=0), {}),
    "paged": (dict(page=16), {}),
    "num_splits": ({}, dict(num_splits=3)),
    "causal": ({}, dict(causal=True)),
    "window": ({}, dict(window_size=(8, -1))),
    "softcap": ({}, dict(softcap=5.0)),
    "softmax_scale": ({}, dict(softmax_scale=0.5)),
    "return_lse": ({}, dict(return_lse=True)),
    "softcap as an int": ({}, dict(softcap=0)),  # valid and equal to 0.0, but another type: its own key
}


@pytest.mark.parametrize("name", list(_CHANGES))
def test_new_metadata_or_options_get_a_plan_of_their_own(fake_triton, name):
    inputs, opts = _CHANGES[name]
    for seed in (1, 2):
        Dm.flash_attn_with_kvcache(**_inputs(seed=seed))
    (base,) = _plans()
    for seed in (1, 2):
        Dm.flash_attn_with_kvcache(**_inputs(seed=seed, **inputs), **opts)
    plans = _plans()
    assert len(plans) == 2 and plans[0] is base, name
    assert plans[1][:-1] == _fresh_plan(_inputs(**inputs), opts)[:-1], name


@pytest.mark.parametrize("page_a,page_b,splits_a,splits_b", [(16, 32, 0, 0), (16, 16, 2, 3)])
def test_page_size_and_split_count_reach_the_launch(fake_triton, page_a, page_b, splits_a, splits_b):
    """A kept plan for one page size / split count never serves another: the grids follow each call."""
    for page, splits in ((page_a, splits_a), (page_b, splits_b)):
        for seed in (1, 2, 3):
            n = len(fake_triton)
            Dm.flash_attn_with_kvcache(**_inputs(page=page, seed=seed), num_splits=splits)
            split = [r for r in fake_triton[n:] if r[1] == "_decode_split"]
            want = _fresh_plan(_inputs(page=page), dict(num_splits=splits))
            assert len(split) == 1 and split[0][2][0] == want.splits and want.page_size == page
    assert len(_plans()) == 2


def test_strides_are_part_of_the_signature(fake_triton):
    args = _inputs()
    wide = torch.zeros(2, 256, 2, 48, dtype=torch.float16)[..., :32]  # same shape, other strides
    for _ in range(2):
        Dm.flash_attn_with_kvcache(**args)
        Dm.flash_attn_with_kvcache(**dict(args, k_cache=wide, v_cache=wide.clone()))
    assert len(_plans()) == 2


def test_rocm_storage_class_is_part_of_the_signature(monkeypatch):
    """On ROCm a tensor's storage above 2 GiB changes Triton's specialisation (buffer loads)."""
    monkeypatch.setattr(L, "MAX_INT32", 64)  # pretend 2 GiB is 64 bytes
    small = torch.empty(1, 2, 2, 8, dtype=torch.float16)  # 64 bytes
    view = torch.empty(2, 2, 2, 8, dtype=torch.float16)[:1]  # same shape and strides, 128-byte storage
    assert small.stride() == view.stride()
    opts = (None, False, 0.0, 0, False)
    sig = lambda backend, t: Dm._signature(backend, (t, t, t, None, None, None, None), opts, (-1, -1))  # noqa: E731
    assert sig("hip", small) != sig("hip", view)
    assert sig("cuda", small) == sig("cuda", view)
    assert sig("cuda", small) != sig("hip", small)


def test_uncovered_input_kinds_are_never_kept(fake_triton):
    """A tensor subclass or a float subclass option is checked on every call, not keyed."""
    args = _inputs()
    for _ in range(3):
        Dm.flash_attn_with_kvcache(**dict(args, q=torch.nn.Parameter(args["q"], requires_grad=False)))
        Dm.flash_attn_with_kvcache(**args, softcap=_Float(2.0))
    assert _plans() == []


class _Float(float):
    pass


_BAD = [  # (change to the good call, exception, words); each after a kept plan of the good call
    (dict(cache_seqlens=torch.tensor([3, 256], dtype=torch.int32)), ValueError, "cache_seqlens[1]"),
    (dict(cache_seqlens=torch.tensor([-1, 3], dtype=torch.int32)), ValueError, "cache_seqlens[0]"),
    (dict(cache_seqlens=torch.tensor([3, 10])), None, None),  # int64 lengths: valid, another signature
    (dict(cache_seqlens=torch.tensor([3, 256])), ValueError, "cache_seqlens[1]"),  # int64, one past the end
    # equal to the good call's values (0 == False == 0.0, -1 == -1.0) but of a type the checks reject
    (dict(causal=0), TypeError, "causal"),
    (dict(num_splits=0.0), ValueError, "num_splits"),
    (dict(window_size=(-1.0, -1)), TypeError, "window_size"),
    (dict(causal=1), TypeError, "causal"),
    (dict(softcap=True), TypeError, "softcap"),
    (dict(num_splits=1.0), ValueError, "num_splits"),
    (dict(num_splits=True), ValueError, "num_splits"),
    (dict(window_size=(-3, 0)), ValueError, "window_size"),
    (dict(window_size=(True, -1)), TypeError, "window_size"),
    (dict(softmax_scale=float("nan")), ValueError, "softmax_scale"),
    (dict(k=None), ValueError, "k and v"),
    (lambda a: dict(q=a["q"].to(torch.bfloat16)), TypeError, "k_cache.dtype"),
    (lambda a: dict(k_cache=a["k_cache"].to("meta"), v_cache=a["v_cache"].to("meta")), ValueError, "k_cache is on"),
    (lambda a: dict(cache_seqlens=a["cache_seqlens"].to("meta")), ValueError, "cache_seqlens is on"),
    (dict(cache_seqlens=256), ValueError, "does not fit"),  # an int: the capacity, no room for the new key
]


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("change,exc,words", _BAD)
def test_bad_input_after_a_kept_plan_raises_before_writing(fake_triton, paged, change, exc, words):
    page = 16 if paged else 0
    for seed in (1, 2, 3):
        Dm.flash_attn_with_kvcache(**_inputs(page=page, seed=seed))
    assert len(_plans()) == 1
    args = _inputs(page=page, seed=4)
    args.update(change(args) if callable(change) else change)
    kc, vc = args["k_cache"], args["v_cache"]
    before = kc.clone(), vc.clone()
    if exc is None:
        Dm.flash_attn_with_kvcache(**args)
        return
    with pytest.raises(exc) as info:  # values: checked on the host with check_values=True (default: on the GPU)
        Dm.flash_attn_with_kvcache(**args, check_values=True)
    assert words in str(info.value)
    if kc.device.type != "meta":
        assert torch.equal(kc, before[0]) and torch.equal(vc, before[1])


def test_bad_block_table_after_a_kept_plan_raises_before_writing(fake_triton):
    for seed in (1, 2, 3):
        Dm.flash_attn_with_kvcache(**_inputs(page=16, seed=seed))
    args = _inputs(page=16, seed=4)
    args["block_table"][0, 0] = 10 ** 6  # a used page outside the cache: same metadata, bad value
    before = args["k_cache"].clone()
    with pytest.raises(ValueError, match=r"block_table\[0\]"):
        Dm.flash_attn_with_kvcache(**args, check_values=True)
    assert torch.equal(args["k_cache"], before)


def test_cpu_tensors_after_a_kept_plan_need_the_interpreter(fake_triton, monkeypatch):
    for seed in (1, 2, 3):
        Dm.flash_attn_with_kvcache(**_inputs(seed=seed))
    monkeypatch.setattr(Dm, "_interpreting", lambda: False)
    with pytest.raises(ValueError, match="CUDA or ROCm"):
        Dm.flash_attn_with_kvcache(**_inputs(seed=4))


def _normalised(args: tuple, user: tuple) -> tuple:
    """Launch arguments with the caller's tensors as their index, fresh buffers as their metadata."""
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            index = next((i for i, u in enumerate(user) if a is u), None)
            out.append(("user", index) if index is not None else ("fresh", a.dtype, tuple(a.shape), a.stride(),
                                                                       a.data_ptr() % 16 == 0))
        else:
            out.append(a)
    return tuple(out)


@pytest.mark.parametrize("num_splits,return_lse", [(0, False), (1, True), (3, True), (4, False)])
def test_kept_launch_keys_replay_what_a_fresh_launch_passes(fake_triton, num_splits, return_lse):
    """Plans kept, launches replayed with each call's tensors: the same grids and arguments as the checked,
    uncached path gives the same call (split + combine, or the split kernel alone at one split)."""
    kinds = []
    for seed in range(4):
        args = _inputs(page=16, seed=seed)
        user = (args["q"], args["k_cache"], args["v_cache"], args["block_table"])
        n = len(fake_triton)
        Dm.flash_attn_with_kvcache(**args, num_splits=num_splits, return_lse=return_lse, causal=True)
        got = [(r[1], r[2], _normalised(r[3], user)) for r in fake_triton[n:]]
        kinds.append([r[0] for r in fake_triton[n:]])
        # the same call with nothing kept anywhere: every launch through the JIT
        saved = dict(L._PLANS), dict(Dm._CALL_PLANS), set(Dm._SEEN)
        L._PLANS.clear()
        Dm.clear_cache()
        n = len(fake_triton)
        args = _inputs(page=16, seed=seed)
        user = (args["q"], args["k_cache"], args["v_cache"], args["block_table"])
        Dm.flash_attn_with_kvcache(**args, num_splits=num_splits, return_lse=return_lse, causal=True)
        want = [(r[1], r[2], _normalised(r[3], user)) for r in fake_triton[n:]]
        assert all(r[0] == "jit" for r in fake_triton[n:])
        assert got == want, seed
        L._PLANS.clear()
        L._PLANS.update(saved[0])
        Dm._CALL_PLANS.update(saved[1])
        Dm._SEEN.update(saved[2])
    launches = 1 if _fresh_plan(_inputs(page=16), dict(num_splits=num_splits)).splits == 1 else 2
    launches += 1  # the new keys' append (one launch before the attention)
    assert kinds[0] == ["jit"] * launches and kinds[2] == kinds[3] == ["replay"] * launches


def test_a_misaligned_tensor_under_a_kept_plan_goes_through_triton(fake_triton):
    """Alignment is not in the signature: the launch checks it per call, and a misaligned q never
    replays the aligned binary (the combine launch, which does not read q, still may)."""
    for seed in (1, 2, 3):
        Dm.flash_attn_with_kvcache(**_inputs(seed=seed))
    args = _inputs(seed=4)
    flat = torch.empty(args["q"].numel() + 1, dtype=args["q"].dtype)
    q = flat[1:].view(args["q"].shape)
    q.copy_(args["q"])
    assert q.data_ptr() % 16 and q.stride() == args["q"].stride()
    n = len(fake_triton)
    Dm.flash_attn_with_kvcache(**dict(args, q=q))
    assert len(_plans()) == 1
    split = [r for r in fake_triton[n:] if r[1] == "_decode_split"]
    assert split[0][0] == "jit" and any(a is q for a in split[0][3])


def test_clear_cache_makes_a_new_database_entry_seen(fake_triton, tmp_path, monkeypatch):
    """After a tune writes the database in this process, decode.clear_cache() (which the tuner calls)
    drops the kept plans with the configs: the next call launches the new entry's split count."""
    from rocmflash import db as D
    from rocmflash.api import selection
    from rocmflash.tuning import decode as TD

    monkeypatch.setenv(D.CONFIG_DIR_ENV, str(tmp_path))
    monkeypatch.delenv("ROCMFLASH_NO_DB", raising=False)
    monkeypatch.setattr(selection, "device_identity", lambda device: ("h100", "sm_90"))

    def write(splits):
        data = D.ConfigDB.new_data("h100", "sm_90", {})
        best = dict(BLOCK_N=32, num_warps=4, num_stages=2, waves_per_eu=0, num_splits=splits)
        data["entries"] = {TD.decode_key(32, "fp16", 2, 256, 2): {"mode": "decode", "measured": True,
                                                                   "timing": "gpu", "best": best}}
        D.atomic_write_json(str(tmp_path / "h100.json"), data)
        D.clear_cache()

    def split_grid():
        n = len(fake_triton)
        Dm.flash_attn_with_kvcache(**_inputs())
        return [r[2][0] for r in fake_triton[n:] if r[1] == "_decode_split"]

    write(3)
    Dm.clear_cache()
    assert [split_grid() for _ in range(3)] == [[3]] * 3 and len(_plans()) == 1
    write(5)
    Dm.clear_cache()
    assert _plans() == []
    assert [split_grid() for _ in range(3)] == [[5]] * 3
    assert isinstance(_plans()[0].cfg, KD.DecodeConfig) and _plans()[0].cfg.num_splits == 5


def test_decode_config_is_kept_per_database_bucket(fake_triton):
    """The config is looked up through the KV-length and batch buckets only, so it is kept per bucket:
    lengths of one bucket share it, the next bucket looks it up anew."""
    from rocmflash.db.lookups import decode as LD

    assert all(C.next_pow2(n) == LD._bucket(n) for n in range(1, 70000))
    cpu = torch.device("cpu")
    a = Dm.decode_config(cpu, 64, torch.float16, 4, 1025, 3)
    assert Dm.decode_config(cpu, 64, torch.float16, 4, 2048, 4) is a and len(Dm._DECODE_CONFIGS) == 1
    Dm.decode_config(cpu, 64, torch.float16, 4, 2049, 4)
    Dm.decode_config(cpu, 64, torch.float16, 4, 2048, 5)
    assert len(Dm._DECODE_CONFIGS) == 3


def test_a_cache_growing_each_call_replays_the_plans_of_its_first_call(fake_triton):
    """A new signature each call (transformers' cache one key longer per step): the split launch's key leaves the
    length out (its LENGTH_ARGS are unspecialised), the combine's never held it, so the first call leaves one plan
    per kernel and every later call replays them -- no plan per length (thousands of those kept the garbage
    collector busy), and no Triton JIT launch per call."""
    plans_before = len(L._PLANS)
    kinds = []
    for L_keys in range(40, 48):
        n = len(fake_triton)
        Dm.flash_attn_with_kvcache(**_inputs(capacity=L_keys, new=0, seed=L_keys), num_splits=2)
        kinds.append([kind for kind, *_ in fake_triton[n:]])
    assert kinds[0] == ["jit", "jit"] and kinds[1:] == [["replay", "replay"]] * 7  # split + combine per call
    assert len(L._PLANS) == plans_before + 2


def _growing(B, Hkv, group, D, lengths, seed=0):
    """transformers' dynamic cache: per call a new (B, Hkv, L, D) tensor per K and V, read as (B, L, Hkv, D)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, 1, Hkv * group, D, generator=gen).half()
    for length in lengths:
        k, v = (torch.randn(B, Hkv, length, D, generator=gen).half().transpose(1, 2) for _ in range(2))
        yield q, k, v


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("D", [32, 40])
def test_a_cache_one_key_longer_each_call_replays_one_plan(fake_triton, num_splits, D):
    """The cache's length reaches the split kernel only through its unspecialised LENGTH_ARGS: a cache one
    key longer each call (new tensors, new strides, no cache_seqlens) goes through Triton once per class
    of those values (D=40: the strides L*40 are multiples of 16 only for even L, so KV_ALIGNED takes both
    values) and replays afterwards, with exactly the grids and arguments a fresh launch passes."""
    kinds, aligned = [], []
    for q, k, v in _growing(2, 2, 2, D, range(300, 308)):
        user = (q, k, v)
        n = len(fake_triton)
        Dm.flash_attn_with_kvcache(q, k, v, num_splits=num_splits)
        got = [(r[1], r[2], _normalised(r[3], user)) for r in fake_triton[n:]]
        kinds.append(tuple(r[0] for r in fake_triton[n:]))
        saved = dict(L._PLANS)
        L._PLANS.clear()
        n = len(fake_triton)
        Dm.flash_attn_with_kvcache(q, k, v, num_splits=num_splits)  # nothing kept: every launch through the JIT
        want = [(r[1], r[2], _normalised(r[3], user)) for r in fake_triton[n:]]
        assert all(r[0] == "jit" for r in fake_triton[n:]) and got == want, k.shape
        split_args = dict(zip(DK._decode_split.arg_names, fake_triton[n][3]))
        assert split_args["CAPACITY"] == k.shape[1] and split_args["stride_kh"] == k.stride(2)
        assert split_args["WHOLE_CACHE"] is True  # no cache_seqlens: no (B,) lengths tensor filled per call
        aligned.append(split_args["KV_ALIGNED"])
        L._PLANS.clear()
        L._PLANS.update(saved)
    classes = 2 if D == 40 else 1
    assert aligned == ([True] * 8 if D == 32 else [True, False] * 4)
    split = [k[0] for k in kinds]  # the split launch, then (several splits) the combine, which never sees the cache
    assert split == ["jit"] * classes + ["replay"] * (8 - classes)
    if num_splits > 1:
        assert [k[1] for k in kinds] == ["jit"] + ["replay"] * 7


def test_the_length_class_keeps_integer_width_and_alignment_apart():
    """What the launch key holds of the cache instead of its length: each LENGTH_ARGS value's integer width
    (Triton types an unspecialised int by range: i32 and i64 are two binaries) and KV_ALIGNED."""
    k = torch.empty(1, 8, 2, 16).transpose(1, 2)
    small = (4096, 16 * 4096, 4096, 16 * 4096, 4096)
    assert KD._length_class(small, k, k) == KD._length_class(tuple(v * 2 for v in small), k, k)
    assert KD._length_class(small, k, k) != KD._length_class((2**31,) + small[1:], k, k)
    assert KD._length_class(small, k, k) != KD._length_class(small[:1] + (16 * 4096 + 8,) + small[2:], k, k)
    assert KD.strides_aligned(small) and not KD.strides_aligned((4097, 8, 16, 16, 16))


def test_a_cache_one_key_longer_each_call_keeps_one_call_plan(fake_triton):
    """No pages, nothing appended: the signature leaves the cache's length out, so a cache one key longer each
    call keeps one plan from its second call on; each call's capacity, config and split count are still its
    own (those of the checked path for that call), and the plan holds no launch keys (they promise one length)."""
    for q, k, v in _growing(2, 2, 2, 32, range(300, 310)):
        plan = Dm._plan(q, k, v, None, None, None, None, None, False, (-1, -1), 0.0, 0, False)
        fresh = Dm._make_plan(q, k, v, None, None, None, None, None, False, (-1, -1), 0.0, 0, False,
                              C.torch_backend(), per_length=True)
        assert plan[:-1] == fresh[:-1] and plan.capacity == k.shape[1]
    (kept,) = _plans()
    assert kept.geometry[:2] == (301, 301) and kept.launch_keys is not None  # made by the second call


def test_a_kept_per_length_plan_still_refuses_k_and_v_of_two_lengths(fake_triton):
    for q, k, v in _growing(2, 2, 2, 32, (300, 301)):
        Dm.flash_attn_with_kvcache(q, k, v)
    (q, k, v), = _growing(2, 2, 2, 32, (302,))
    n = len(fake_triton)
    with pytest.raises(ValueError, match="k_cache and v_cache must have the same shape"):
        Dm.flash_attn_with_kvcache(q, k, v[:, :-1])
    assert len(fake_triton) == n  # nothing launched


def test_a_second_cache_size_gets_its_own_kept_plan_and_launch_keys(fake_triton):
    """A model that keeps a cache of one size, then one of another (no append, the length-free signature already
    kept): the second size is served by the length-free plan on its first call and kept under its own signature,
    with launch keys, from its second call on -- its launches replay without recomputing keys."""
    q, k1, v1 = next(_growing(2, 2, 2, 32, (300,)))
    for _ in range(2):
        Dm.flash_attn_with_kvcache(q, k1, v1)
    (_, k2, v2), = _growing(2, 2, 2, 32, (400,), seed=1)
    first = Dm._plan(q, k2, v2, None, None, None, None, None, False, (-1, -1), 0.0, 0, False)
    assert first.capacity == 400 and first.launch_keys is None
    second = Dm._plan(q, k2, v2, None, None, None, None, None, False, (-1, -1), 0.0, 0, False)
    assert second.capacity == 400 and second.launch_keys is not None
    assert Dm._plan(q, k2, v2, None, None, None, None, None, False, (-1, -1), 0.0, 0, False) is second


def test_a_plan_kept_for_one_cache_tensor_as_k_and_v_never_serves_two(fake_triton):
    """A cache passed as both ``k_cache`` and ``v_cache`` (legal: K and V then are one tensor) keeps plans whose
    slots point both arguments at it; a later call with two caches of the same layout must get its own (the
    aliasing is in the signature) and every launch passes its own ``v_cache``, as the JIT path does."""
    for seed in range(3):  # kept from the second call on
        args = _inputs(seed=seed)
        args["v_cache"] = args["k_cache"]
        Dm.flash_attn_with_kvcache(**args)
    for seed in range(3, 6):
        args = _inputs(seed=seed)
        n = len(fake_triton)
        Dm.flash_attn_with_kvcache(**args)
        passed = [r[3] for r in fake_triton[n:]]
        assert any(any(a is args["v_cache"] for a in launch) for launch in passed), "v_cache never reached a launch"
        for launch in passed:
            assert not any(a is args["k_cache"] for a in launch) or any(a is args["v_cache"] for a in launch)
