"""The public API's repeat-call path (#28 item 5), on the CPU.

A default call whose signature (shapes, strides, dtypes, devices, causal flag, where it may run) passed every
check before skips the checks and goes to its plan (``rocmflash.api.attention._PLANS``); a call with anything
else still goes through them. The per-call switches are read through ``os.environ``'s own dict
(``rocmflash.kernels.launch.env_value``): a change acts on the next call, at a dict lookup's cost.
"""

import os

import pytest
import torch

import rocmflash
from rocmflash.api import attention as api
from rocmflash.api import ops, selection
from rocmflash.kernels import launch as L

pytestmark = [pytest.mark.usefixtures("interpret", "fresh_selection"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def _qkv(B=1, Hq=4, Hkv=2, S=32, D=32, seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, h, S, D, generator=g).half().requires_grad_(grad) for h in (Hq, Hkv, Hkv)]


def _forbid_checks(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("a repeat call ran the checks")

    for name in ("_check_inputs", "_check_shapes", "_run"):
        monkeypatch.setattr(api, name, boom)


def test_env_value_follows_environ_on_every_read(monkeypatch):
    """``env_value`` is ``os.environ.get`` (set, changed, unset, also through ``os.environ`` directly), and the
    switches built on it act on the next read."""
    monkeypatch.delenv("ROCMFLASH_TEST_ENV_VALUE", raising=False)
    assert L.env_value("ROCMFLASH_TEST_ENV_VALUE") is None
    monkeypatch.setenv("ROCMFLASH_TEST_ENV_VALUE", "a b")
    assert L.env_value("ROCMFLASH_TEST_ENV_VALUE") == "a b" == os.environ.get("ROCMFLASH_TEST_ENV_VALUE")
    os.environ["ROCMFLASH_TEST_ENV_VALUE"] = "é"
    assert L.env_value("ROCMFLASH_TEST_ENV_VALUE") == "é"
    monkeypatch.delenv("ROCMFLASH_TEST_ENV_VALUE")
    assert L.env_value("ROCMFLASH_TEST_ENV_VALUE") is None
    for value, want in (("1", True), ("0", False), ("", False)):
        monkeypatch.setenv(selection.NO_INCUMBENT_ENV, value)
        assert selection.incumbent_disabled() is want
    monkeypatch.delenv(selection.NO_INCUMBENT_ENV)
    assert selection.incumbent_disabled() is False
    for value, want in (("TRUE", True), ("on", True), ("0", False)):
        monkeypatch.setenv("TRITON_INTERPRET", value)
        assert L.interpreting() is want
    monkeypatch.delenv("TRITON_INTERPRET")
    assert L.interpreting() is False


@pytest.mark.parametrize("entry", ["attention", "flash_attn_func"])
def test_repeat_call_skips_the_checks_and_gives_the_same_answer(monkeypatch, entry):
    """The second call of a checked signature runs none of the checks (before: all of them every call), with
    the same output, LSE and gradients; a call of another signature is checked."""
    q, k, v = _qkv(grad=True)
    do = torch.randn_like(q)
    if entry == "attention":
        def call(q, k, v, **kw):
            out, lse = rocmflash.attention(q, k, v, causal=True, return_lse=True, **kw)
            return out, lse
    else:
        q, k, v = (t.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_(True) for t in (q, k, v))

        def call(q, k, v, **kw):
            out, lse, _ = rocmflash.flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                    causal=True, return_attn_probs=True, **kw)
            return out.transpose(1, 2), lse
    first, lse1 = call(q, k, v)
    g1 = torch.autograd.grad(first, (q, k, v), do)
    scaled = call(q, k, v, softmax_scale=0.5)[0]
    with monkeypatch.context() as mp:
        _forbid_checks(mp)
        again, lse2 = call(q, k, v)
        g2 = torch.autograd.grad(again, (q, k, v), do)
        assert torch.equal(call(q, k, v, softmax_scale=0.5)[0], scaled)
        with pytest.raises(AssertionError, match="checks"):  # another signature: checked
            call(q[:, :, :-1], k, v)
    assert torch.equal(first, again) and torch.equal(lse1, lse2)
    assert all(torch.equal(a, b) for a, b in zip(g1, g2))


def test_bad_input_with_a_planned_signature_is_refused():
    """What the signature does not hold (argument types and values) is checked on every call."""
    q, k, v = _qkv()
    rocmflash.attention(q, k, v)
    qb, kb, vb = (t.transpose(1, 2) for t in (q, k, v))
    rocmflash.flash_attn_func(qb, kb, vb)
    assert len(api._PLANS) == 2
    with pytest.raises(TypeError, match="causal"):
        rocmflash.attention(q, k, v, causal=1)
    with pytest.raises(ValueError, match="finite"):
        rocmflash.attention(q, k, v, softmax_scale=float("inf"))
    with pytest.raises(ValueError, match="variant"):
        rocmflash.attention(q, k, v, variant="nope")
    with pytest.raises(TypeError, match="q_descale"):
        rocmflash.attention(q, k, v, q_descale=torch.ones(1, 2))
    with pytest.raises(NotImplementedError, match="dropout"):
        rocmflash.flash_attn_func(qb, kb, vb, dropout_p=0.1)
    with pytest.raises(TypeError, match="deterministic"):
        rocmflash.flash_attn_func(qb, kb, vb, deterministic=1)
    with pytest.raises(NotImplementedError, match="alibi"):
        rocmflash.flash_attn_func(qb, kb, vb, alibi_slopes=torch.ones(4))
    with pytest.raises(TypeError, match="k.dtype"):
        rocmflash.attention(q, k.bfloat16(), v)


def test_interpreter_switch_and_clear_cache_reach_the_api_plans(monkeypatch):
    """A CPU call planned under the interpreter is refused once ``TRITON_INTERPRET`` is unset (read per call),
    and ``selection.clear_cache()`` forgets the API's plans with the selections."""
    q, k, v = _qkv()
    rocmflash.attention(q, k, v)
    assert api._PLANS
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        rocmflash.attention(q, k, v)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    selection.clear_cache()
    assert not api._PLANS and not ops._CALLS


def test_patched_sdpa_repeat_call_skips_supported_and_odd_calls_are_checked(monkeypatch):
    """Under patch_sdpa a signature ``supported`` accepted goes straight to its plan on the next call (same answer);
    a mask, an int scale, a non-bool flag or a new shape is checked in full again; clear_cache forgets the plans."""
    import torch.nn.functional as F

    from rocmflash.api import sdpa

    seen, real = [], sdpa.supported
    monkeypatch.setattr(sdpa, "supported", lambda *a, **k: seen.append(1) or real(*a, **k))
    q, k, v = _qkv()
    with rocmflash.patch_sdpa():
        first = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        again = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        assert len(seen) == 1 and torch.equal(first, again) and sdpa._PLANS
        mask = torch.ones(32, 32, dtype=torch.bool)
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)  # falls back, checked
        F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True, scale=1)  # int scale: checked
        with pytest.raises(TypeError):  # not a bool: checked, refused by rocmflash, then by torch's own SDPA
            F.scaled_dot_product_attention(q, k, v, is_causal=1, enable_gqa=True)
        assert len(seen) == 4
        q2, k2, v2 = _qkv(S=48, seed=1)
        F.scaled_dot_product_attention(q2, k2, v2, enable_gqa=True)
        assert len(seen) == 5
        selection.clear_cache()
        assert not sdpa._PLANS
        F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        assert len(seen) == 6


def test_attention_output_is_laid_out_as_q_like_sdpa():
    """No output copy: a (B, H, S, D) view of (B, S, H, D) memory in gives one out (merging heads is then free), as
    SDPA's output does; a contiguous q gives a contiguous output; the values are the same either way."""
    g = torch.Generator().manual_seed(5)
    base = [torch.randn(1, 32, h, 32, generator=g).half() for h in (4, 2, 2)]
    views = [t.transpose(1, 2) for t in base]
    for _ in range(2):  # the checked call, then the planned repeat call
        out = rocmflash.attention(*views, causal=True)
        assert out.transpose(1, 2).is_contiguous() and not out.is_contiguous()
    dense = rocmflash.attention(*[t.contiguous() for t in views], causal=True)
    assert dense.is_contiguous() and torch.allclose(dense, out, atol=1e-3)
