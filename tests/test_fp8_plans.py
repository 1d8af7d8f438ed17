"""The fp8 forward's repeat-call path (rocmflash.api.fp8_plans), on the CPU.

An fp8 call whose signature (q/k/v and descale dtypes, shapes, strides and devices; the options) passed every check
twice goes to its kept plan: no checks, no selection, kept launch keys. Anything else is checked. Numerics of the
planned path are held to the same reference as the checked one: fp32 attention of the dequantised inputs.
"""

import pytest
import torch

import rocmflash
from rocmflash.api import attention as api
from rocmflash.api import fp8 as F8
from rocmflash.api import fp8_plans, selection
from rocmflash.kernels.fp8 import forward as fp8_forward
from rocmflash.tuning import live_fp8, live_gate

pytestmark = [pytest.mark.usefixtures("interpret", "fresh_selection"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]
E4M3 = torch.float8_e4m3fn


def _inputs(B=1, Hq=4, Hkv=2, Sq=24, Sk=40, D=32, seed=0, dtype=E4M3, bshd=False):
    gen = torch.Generator().manual_seed(seed)
    shape = (lambda h, s: (B, s, h, D)) if bshd else (lambda h, s: (B, h, s, D))
    q, k, v = (live_fp8.fill(torch.empty(shape(h, s), dtype=dtype), gen) for h, s in ((Hq, Sq), (Hkv, Sk), (Hkv, Sk)))
    return (q, k, v), live_fp8.descales(B, Hkv, dtype, "cpu", gen)


def _reference(q, k, v, descales, causal, bshd=False):
    if bshd:
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    deq = [live_fp8.dequantised(x, d) for x, d in zip((q, k, v), descales)]
    out = live_gate.reference(*deq, causal, q.shape[-1] ** -0.5)
    return out.transpose(1, 2) if bshd else out


def _rel(out, ref):
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def _forbid_checks(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("a repeat call ran the checks")

    monkeypatch.setattr(api, "_fp8_run", boom)
    monkeypatch.setattr(F8, "attention_fp8", boom)
    monkeypatch.setattr(fp8_forward, "launch", boom)  # the checked launcher (the plan runs launch_kept)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("entry", ["attention", "flash_attn_func"])
def test_a_signature_checked_twice_runs_its_plan_with_the_same_answer(monkeypatch, entry, causal):
    """The third call of a signature runs none of the checks, and gives the checked calls' answer (bit for bit:
    same kernel, same config) and LSE, within fp8's bound of the fp32 reference; new inputs of the same
    signature give their own answer."""
    bshd = entry == "flash_attn_func"
    (q, k, v), ds = _inputs(bshd=bshd)
    kw = dict(zip(("q_descale", "k_descale", "v_descale"), ds))
    if bshd:
        def call(q, k, v):
            out, lse, _ = rocmflash.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True, **kw)
            return out, lse
    else:
        def call(q, k, v):
            return rocmflash.attention(q, k, v, causal=causal, return_lse=True, **kw)
    first, lse1 = call(q, k, v)
    second, _ = call(q, k, v)
    assert len(fp8_plans._PLANS) == 1  # kept from the signature's second call on
    (q2, k2, v2), _ = _inputs(seed=1, bshd=bshd)
    with monkeypatch.context() as mp:
        _forbid_checks(mp)
        again, lse2 = call(q, k, v)
        other, _ = call(q2, k2, v2)
        with pytest.raises(AssertionError, match="checks"):  # another signature: checked
            call(q[:, :-1] if bshd else q[:, :, :-1], k, v)
    assert torch.equal(first, second) and torch.equal(first, again) and torch.equal(lse1, lse2)
    assert again.dtype == torch.bfloat16 and again.shape == q.shape and again.is_contiguous()
    assert _rel(again, _reference(q, k, v, ds, causal, bshd)) < 2 ** -4
    ref2 = _reference(q2, k2, v2, ds, causal, bshd)
    assert _rel(other, ref2) < 2 ** -4 and not torch.equal(other, again)


def test_bad_input_after_a_plan_is_still_refused():
    """What differs from a planned signature (descale shape, dtype, a NaN or infinite scale, an odd flag, the other
    fp8 family's partner) is checked and refused as on a first call; a NaN descale *value* on a planned call is
    still reported (the interpreter reads the error word after the launch)."""
    (q, k, v), (qd, kd, vd) = _inputs()
    for _ in range(3):
        rocmflash.attention(q, k, v, q_descale=qd, k_descale=kd, v_descale=vd)
    assert len(fp8_plans._PLANS) == 1
    with pytest.raises(ValueError, match="k_descale must have shape"):
        rocmflash.attention(q, k, v, q_descale=qd, k_descale=kd[:, :1], v_descale=vd)
    with pytest.raises(TypeError, match="v_descale.dtype"):
        rocmflash.attention(q, k, v, q_descale=qd, k_descale=kd, v_descale=vd.double())
    with pytest.raises(ValueError, match="finite"):
        rocmflash.attention(q, k, v, softmax_scale=float("nan"), q_descale=qd, k_descale=kd, v_descale=vd)
    with pytest.raises(TypeError, match="causal"):
        rocmflash.attention(q, k, v, causal=1, q_descale=qd, k_descale=kd, v_descale=vd)
    with pytest.raises(TypeError, match="out_dtype"):
        rocmflash.attention(q, k, v, q_descale=qd, k_descale=kd, v_descale=vd, out_dtype=torch.float32)
    with pytest.raises(TypeError, match="k.dtype"):
        rocmflash.attention(q, k.view(torch.float8_e5m2), v, q_descale=qd, k_descale=kd, v_descale=vd)
    with pytest.raises(ValueError, match="q is on cpu"):  # get_device() is -1 on the CPU and on meta alike
        rocmflash.attention(q, k, v, q_descale=qd, k_descale=kd.to("meta"), v_descale=vd)
    with pytest.raises(ValueError, match="q_descale is required"):
        rocmflash.attention(q, k, v, k_descale=kd, v_descale=vd)
    bad = qd.clone()
    bad[0, 1] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        rocmflash.attention(q, k, v, q_descale=bad, k_descale=kd, v_descale=vd)
    out = rocmflash.attention(q, k, v, q_descale=qd, k_descale=kd, v_descale=vd)  # reported once, then clean
    assert torch.isfinite(out).all()


def test_options_are_part_of_the_signature():
    """Scale, causal flag, LSE and output dtype each make their own plan, with their own answer."""
    (q, k, v), ds = _inputs()
    kw = dict(zip(("q_descale", "k_descale", "v_descale"), ds))
    variants = [dict(), dict(softmax_scale=0.05), dict(causal=True), dict(out_dtype=torch.float16)]
    outs = []
    for extra in variants:
        for _ in range(3):
            out = rocmflash.attention(q, k, v, **kw, **extra)
        outs.append(out)
    assert len(fp8_plans._PLANS) == len(variants)
    assert outs[3].dtype == torch.float16 and outs[0].dtype == torch.bfloat16
    for a in range(3):
        for b in range(a + 1, 3):
            assert not torch.equal(outs[a], outs[b])
    assert _rel(outs[1], live_gate.reference(*[live_fp8.dequantised(x, d) for x, d in zip((q, k, v), ds)],
                                             False, 0.05)) < 2 ** -4


def test_planned_calls_stay_inference_only_and_handle_empty_inputs():
    """A planned call that autograd records still has the backward that raises; a planned call with no keys
    gives 0 and LSE -inf, as the checked one."""
    (q, k, v), ds = _inputs()
    kw = dict(zip(("q_descale", "k_descale", "v_descale"), ds))
    for _ in range(3):
        rocmflash.attention(q, k, v, **kw)
    dsg = [d.clone().requires_grad_(True) for d in ds]
    out = rocmflash.attention(q, k, v, q_descale=dsg[0], k_descale=dsg[1], v_descale=dsg[2])
    assert out.requires_grad
    with pytest.raises(NotImplementedError, match="inference-only"):
        out.float().sum().backward()
    (q0, k0, v0), ds0 = _inputs(Sk=0)
    for _ in range(3):
        out, lse = rocmflash.attention(q0, k0, v0, return_lse=True, q_descale=ds0[0], k_descale=ds0[1],
                                       v_descale=ds0[2])
    assert fp8_plans._PLANS and torch.equal(out, torch.zeros_like(out))
    assert torch.isinf(lse).all() and (lse < 0).all()


def test_clear_cache_and_the_interpreter_switch_reach_the_plans(monkeypatch):
    """``selection.clear_cache()`` forgets the plans; a CPU plan is not served once ``TRITON_INTERPRET`` is unset
    (the signature holds the switch): the checks refuse the call."""
    (q, k, v), ds = _inputs()
    kw = dict(zip(("q_descale", "k_descale", "v_descale"), ds))
    for _ in range(2):
        rocmflash.attention(q, k, v, **kw)
    assert fp8_plans._PLANS
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        rocmflash.attention(q, k, v, **kw)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    selection.clear_cache()
    assert not fp8_plans._PLANS and not fp8_plans._SEEN


def test_kept_launch_keys_replay_the_launch_a_checked_call_makes(monkeypatch):
    """Compiled-launch path with Triton's launcher stubbed (CPU tensors, which the V copy takes to its kernel under
    the interpreter switch): a plan's launches on an arch that reads V K-major keep the V copy's and the kernel's
    launch keys, equal to the keys a launch without a plan computes (one launch plan each, replayed); a misaligned
    tensor gets no kept key."""
    from rocmflash.kernels.fp8 import vlayout as VL
    from rocmflash.kernels import launch as L

    launched = []

    class _Runner:
        def __getitem__(self, grid):
            return lambda *args: launched.append(args)

    monkeypatch.setattr(L, "interpreting", lambda: False)
    monkeypatch.setattr(L, "_jit_launch", lambda fn, grid, kwargs: _Runner())
    monkeypatch.setattr(L, "_is_compiled_kernel", lambda obj: isinstance(obj, _Runner))
    monkeypatch.setattr(L, "FAST_LAUNCH", True)
    monkeypatch.setattr(L, "_PLANS", {})
    (q, k, v), (qd, kd, vd) = _inputs()
    out = torch.empty(q.shape, dtype=torch.bfloat16)
    plan_keys = {}
    cfg = fp8_forward.default_config(None, q.shape[-1])
    for keys in (plan_keys, plan_keys, None):
        fp8_forward.launch_kept(q, k, v, qd, kd, vd, cfg, False, 0.125, out, None, True, keys)
    assert set(plan_keys) == {VL._SCALARS, ("fp8",)}
    # one launch plan per kernel, made by the first call (through the stubbed JIT launch) and replayed by the other two
    assert len(L._PLANS) == 2 and len(launched) == 4
    assert all(key in L._PLANS for key in plan_keys.values())
    off = torch.empty(q.numel() + 1, dtype=q.dtype)[1:].view(q.shape)
    off.copy_(q)
    assert fp8_plans.FF is fp8_forward and L.kept_key(plan_keys, ("fp8",), None, (), (off,), cfg, "cuda") is None


def test_a_selector_override_reaches_the_fp8_kernel_and_ends_with_its_block(monkeypatch):
    """``SELECTOR.override("fp8", cfg)``: an fp8 call (its plan kept from before) launches ``cfg``, still within
    fp8's bound of the reference; after the block the kernel's default comes back."""
    import rocmflash
    from rocmflash.api.select import SELECTOR
    from rocmflash.config import KernelConfig
    from rocmflash.kernels.launch import observe_launches

    (q, k, v), ds = _inputs()
    kw = dict(zip(("q_descale", "k_descale", "v_descale"), ds))
    ref = _reference(q, k, v, ds, False)
    with observe_launches() as before:
        rocmflash.attention(q, k, v, **kw)
        rocmflash.attention(q, k, v, **kw)  # a kept plan now
    forced = KernelConfig(BLOCK_M=32, BLOCK_N=32, num_warps=2, num_stages=1)
    with SELECTOR.override("fp8", forced), observe_launches() as seen:
        out = rocmflash.attention(q, k, v, **kw)
    assert [r["options"]["num_warps"] for r in seen] == [2] and _rel(out, ref) < 0.1
    with observe_launches() as after:
        rocmflash.attention(q, k, v, **kw)
    assert [r["options"]["num_warps"] for r in after] == [before[0]["options"]["num_warps"]] != [2]
