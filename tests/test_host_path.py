"""The host path between a call and its launch (#28 item 5), on the CPU.

A default call (``variant="online"``, no config) is decided once per signature (q's shape and strides,
k's shape, dtype, device, causal flag): the plan (:class:`rocmflash.api.ops._Call`) holds the output layout,
the decode and incumbent decisions and the configs, so a repeat call runs no selection, and the
dispatch to the platform's SDPA adds a dict lookup. These tests check that a repeat call asks no
selection function, that the plan's layouts are ``empty_like_layout``'s, that the per-call switches
(``ROCMFLASH_NO_INCUMBENT``, ``selection.clear_cache``) still act, that bad input after a good call of the
same signature is still refused, and bound the Python calls a repeat call makes inside rocmflash.
"""

import math
import sys

import pytest
import torch

import rocmflash
from rocmflash.api import ops, selection
from rocmflash.config import KernelConfig
from rocmflash.kernels.backward.host import empty_like_layout
from rocmflash.kernels.launch import observe_launches

pytestmark = [pytest.mark.usefixtures("interpret", "fresh_selection"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def _qkv(B=1, Hq=4, Hkv=2, S=32, D=32, grad=False, seed=0, bshd=False, dtype=torch.float16):
    g = torch.Generator().manual_seed(seed)
    shapes = [(B, S, h, D) if bshd else (B, h, S, D) for h in (Hq, Hkv, Hkv)]
    ts = [torch.randn(*s, generator=g).to(dtype) for s in shapes]
    ts = [t.transpose(1, 2) if bshd else t for t in ts]  # (B, H, S, D) views of (B, S, H, D) memory
    return [t.requires_grad_(grad) for t in ts]


def _entry_db(tmp_path, monkeypatch, field, D=32, group=2, bucket=32):
    """A user database whose d{D}-fp16-full-gqa{group}-s{bucket} entry carries the incumbent ``field``."""
    db = pytest.importorskip("rocmflash.db")
    monkeypatch.setenv(db.CONFIG_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(db, "shipped_config_dir", lambda: str(tmp_path / "no-shipped"))
    monkeypatch.setattr(selection, "device_identity", lambda device: ("h100", "sm_90"))
    d = db.ConfigDB.open(str(tmp_path / "h100.json"), "h100", "sm_90", {"test": True})
    entry = {"best": KernelConfig(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1).to_dict(), "measured": True,
             "incumbent": field}
    d.put(db.problem_key(D, "fp16", False, group, bucket), entry)
    d.save()


SDPA_WINS = {"backend": "default", "time_ms": 0.1, "triton_ms": 0.2,
             "train": {"backend": "default", "time_ms": 0.3, "triton_ms": 0.5}}


def _forbid_selection(monkeypatch):
    """Make every selection entry point the hot path could reach raise."""
    def boom(*args, **kwargs):
        raise AssertionError("a repeat call ran a selection")

    for mod, names in ((ops, ("select_config", "select_bwd_config", "entry_incumbent", "call_incumbents", "select_incumbent",
                              "shape_excludes", "is_decode_shaped")),
                       (selection, ("select_config", "select_bwd_config", "select_incumbent", "entry_incumbent",
                                    "_db_lookup", "device_identity"))):
        for name in names:
            if hasattr(mod, name):
                monkeypatch.setattr(mod, name, boom)


def test_repeat_call_runs_no_selection(monkeypatch):
    """The second call of a signature, forward and forward+backward, asks no selection function: the plan
    decided it (before: select_incumbent, shape_excludes and select_config on every call)."""
    q, k, v = _qkv(grad=True)
    do = torch.randn_like(q)
    first = rocmflash.attention(q, k, v, causal=True)
    g1 = torch.autograd.grad(first, (q, k, v), do)
    _forbid_selection(monkeypatch)
    again = rocmflash.attention(q, k, v, causal=True)
    g2 = torch.autograd.grad(again, (q, k, v), do)
    assert torch.equal(first, again) and all(torch.equal(a, b) for a, b in zip(g1, g2))
    with torch.no_grad():
        assert torch.equal(rocmflash.attention(q, k, v, causal=True), first)


def test_incumbent_dispatch_is_one_lookup_and_the_switch_still_acts(tmp_path, monkeypatch):
    """Where the entry says SDPA won, a repeat call runs SDPA without a selection; ROCMFLASH_NO_INCUMBENT
    set afterwards sends the next call to rocmflash's kernel (the switch is read per call)."""
    _entry_db(tmp_path, monkeypatch, SDPA_WINS)
    q, k, v = _qkv()
    with observe_launches() as seen:
        out = rocmflash.attention(q, k, v)
    assert seen == []
    with pytest.MonkeyPatch.context() as mp, observe_launches() as seen:
        _forbid_selection(mp)
        again = rocmflash.attention(q, k, v)
    assert seen == [] and torch.equal(out, again)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    assert torch.equal(again, ref)
    monkeypatch.setenv(selection.NO_INCUMBENT_ENV, "1")
    with observe_launches() as seen:
        kernel = rocmflash.attention(q, k, v)
    assert seen and (kernel.float() - ref.float()).abs().max() < 1e-2


def test_clear_cache_drops_the_plans(tmp_path, monkeypatch):
    """A database written after a call decides the next call once ``selection.clear_cache()`` ran."""
    q, k, v = _qkv(seed=1)
    monkeypatch.setattr(selection, "device_identity", lambda device: ("h100", "sm_90"))
    with observe_launches() as seen:
        rocmflash.attention(q, k, v)  # no database: rocmflash's kernel, and a plan that says so
    assert seen
    _entry_db(tmp_path, monkeypatch, SDPA_WINS)
    selection.clear_cache()
    with observe_launches() as seen:
        rocmflash.attention(q, k, v)
    assert seen == []


@pytest.mark.parametrize("shape", [(1, 2, 16, 64), (2, 4, 1, 32), (1, 1, 1, 16), (3, 2, 0, 32), (0, 2, 5, 16),
                                   (2, 3, 7, 48)])
def test_plan_layouts_are_empty_like_layouts(shape):
    """The strides the plan allocates with are ``empty_like_layout``'s, for contiguous tensors, transposed
    (B, S, H, D) views, other permutations and size-0/1 extents."""
    B, H, S, D = shape
    cases = [torch.empty(shape), torch.empty(B, S, H, D).transpose(1, 2), torch.empty(B, H, D, S).transpose(2, 3),
             torch.empty(S, B, H, D).permute(1, 2, 0, 3), torch.empty(B, H, S, 2 * D)[..., :D]]
    cases += [t[:, :, :, ::2] for t in cases[:2]]  # strided views: contiguous neither way
    for t in cases:
        want = empty_like_layout(t)
        assert ops._layout_strides(t.shape, ops._is_bshd(t)) == want.stride(), (t.shape, t.stride())
        assert ops._contiguous(tuple(t.shape), t.stride()) == t.is_contiguous()


@pytest.mark.parametrize("bshd", [False, True], ids=["bhsd", "bshd-views"])
def test_eager_plan_matches_the_op(bshd):
    """Outputs and gradients of the planned eager path equal the dispatcher op's, values and strides
    (GQA; (B, S, H, D) views as flash_attn_func and transformers pass them)."""
    q, k, v = _qkv(B=2, Hq=4, Hkv=2, S=24, D=32, grad=True, bshd=bshd, dtype=torch.bfloat16)
    scale = 1 / math.sqrt(32)
    out, lse = ops.attention_forward(q, k, v, True, scale)
    o_op, lse_op = torch.ops.rocmflash.attn_fwd(q, k, v, True, scale, "online", "")
    assert torch.equal(out, o_op) and torch.equal(lse, lse_op) and out.stride() == o_op.stride()
    do = torch.randn_like(out)
    fast = torch.autograd.grad(out, (q, k, v), do)
    slow = torch.autograd.grad(o_op, (q, k, v), do)
    for a, b, t in zip(fast, slow, (q, k, v)):
        assert torch.equal(a, b) and a.stride() == b.stride() == empty_like_layout(t).stride()


def test_an_sdpa_served_plan_never_answers_other_key_value_dtypes_or_devices(tmp_path, monkeypatch):
    """A plan SDPA serves is keyed by q and the shapes only (k's and v's dtypes and devices are SDPA's own checks on
    that path): k or v of another dtype or device than the planned call's gets an error, never an answer; the same
    call then runs rocmflash's checks where rocmflash's kernels serve it."""
    _entry_db(tmp_path, monkeypatch, SDPA_WINS)
    selection.clear_cache()
    q, k, v = _qkv()
    with torch.no_grad():
        good = rocmflash.attention(q, k, v)
        assert torch.equal(rocmflash.attention(q, k, v), good)  # the planned repeat call
        for bad in ((q, k.bfloat16(), v), (q, k, v.float()), (q, k.to("meta"), v)):
            with pytest.raises((RuntimeError, TypeError, ValueError)):
                rocmflash.attention(*bad)
        monkeypatch.setenv(selection.NO_INCUMBENT_ENV, "1")  # rocmflash's kernels serve the same plan: its checks
        with pytest.raises(TypeError, match="k.dtype"):
            rocmflash.attention(q, k.bfloat16(), v)


def test_bad_input_after_a_good_call_is_still_refused():
    """Every check guards each call: a bad call with the signature of a planned good one still raises."""
    q, k, v = _qkv()
    rocmflash.attention(q, k, v)
    rocmflash.flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    with pytest.raises(TypeError, match="k.dtype"):
        rocmflash.attention(q, k.bfloat16(), v)
    with pytest.raises(TypeError, match="dtype"):
        rocmflash.attention(q.float(), k.float(), v.float())
    with pytest.raises(ValueError, match="meta"):
        rocmflash.attention(q.to("meta"), k.to("meta"), v.to("meta"))
    with pytest.raises(ValueError, match="device"):
        rocmflash.attention(q, k.to("meta"), v)
    with pytest.raises(ValueError, match="finite"):
        rocmflash.attention(q, k, v, softmax_scale=float("nan"))
    with pytest.raises(TypeError, match="softmax_scale"):
        rocmflash.attention(q, k, v, softmax_scale="0.1")
    with pytest.raises(TypeError, match="causal"):
        rocmflash.attention(q, k, v, causal=1)
    with pytest.raises(ValueError, match="same shape"):
        rocmflash.attention(q, k, v[:, :, :-1])
    with pytest.raises(ValueError, match="multiple"):
        rocmflash.attention(q[:, :3], k, v)
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        rocmflash.attention(q, k.numpy(), v)
    with pytest.raises(TypeError, match="q_descale"):
        rocmflash.attention(q, k, v, q_descale=torch.ones(1, 2))
    qb, kb, vb = (t.transpose(1, 2) for t in (q, k, v))
    with pytest.raises(ValueError, match="softcap"):
        rocmflash.flash_attn_func(qb, kb, vb, softcap=-1.0)
    with pytest.raises(ValueError, match="window_size"):
        rocmflash.flash_attn_func(qb, kb, vb, window_size=(-2, -1))
    with pytest.raises(TypeError, match="softcap"):
        rocmflash.flash_attn_func(qb, kb, vb, softcap="0")
    out = rocmflash.flash_attn_func(qb, kb, vb, window_size=[-1, -1], softcap=0)  # the defaults, other types
    assert torch.equal(out, rocmflash.flash_attn_func(qb, kb, vb))


def _rocmflash_calls(fn) -> list:
    """Names of the Python functions of rocmflash's modules that run during ``fn()``."""
    seen = []

    def prof(frame, event, arg):
        if event == "call" and frame.f_globals.get("__name__", "").startswith("rocmflash"):
            seen.append(f"{frame.f_globals['__name__']}.{frame.f_code.co_name}")

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return seen


class _NoLaunch:
    def launch(self, *args, **kwargs):
        pass


def test_repeat_call_python_cost_is_bounded(tmp_path, monkeypatch):
    """A repeat default call makes a bounded number of Python calls inside rocmflash before its launch
    (the kernel launch itself is replaced here), and the incumbent dispatch fewer still. Before the plans a
    forward made about 30 (selection, incumbent rules and environment reads on every call)."""
    q, k, v = _qkv()
    monkeypatch.setattr(ops, "get_variant", lambda name: _NoLaunch())
    with torch.no_grad():
        rocmflash.attention(q, k, v, causal=True)
        calls = _rocmflash_calls(lambda: rocmflash.attention(q, k, v, causal=True))
    assert len(calls) <= 20, calls
    assert not any(".selection." in c or c.endswith("shape_excludes") for c in calls), calls
    _entry_db(tmp_path, monkeypatch, SDPA_WINS)
    selection.clear_cache()
    with torch.no_grad():
        rocmflash.attention(q, k, v)
        calls = _rocmflash_calls(lambda: rocmflash.attention(q, k, v))
    assert len(calls) <= 18 and any(c.startswith("rocmflash.api.incumbent.sdpa_attention") for c in calls), calls
