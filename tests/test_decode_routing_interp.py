"""A decode-shaped call (a few query tokens over many keys) through every dense entry point runs the
split-KV decode kernel (``rocmflash.api.decode.attend_whole_cache``), with the dense call's semantics:
output and LSE against fp64, gradients through the dense backward, odd layouts, and the shapes that
stay on the dense kernel. Triton's interpreter (CPU)."""

import math

import pytest
import torch

from varlen_reference import attention_fp64, rel_err

TOL = 1e-2  # fp16


def _bhsd(B, Sq, Sk, Hq, Hkv, D, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, Sq, D, generator=gen).half()
    k = torch.randn(B, Hkv, Sk, D, generator=gen).half()
    v = torch.randn(B, Hkv, Sk, D, generator=gen).half()
    return q, k, v


def _ref(q, k, v, causal):
    """fp64 (out (B, Hq, Sq, D), lse (B, Hq, Sq)) of (B, H, S, D) inputs."""
    scale = 1 / math.sqrt(q.shape[-1])
    pairs = [attention_fp64(q[b].transpose(0, 1), k[b].transpose(0, 1), v[b].transpose(0, 1), scale, causal)
             for b in range(q.shape[0])]
    return torch.stack([o.transpose(0, 1) for o, _ in pairs]), torch.stack([lse for _, lse in pairs])


def _entry_points():
    import rocmflash
    from rocmflash.api import sdpa

    def patched(q, k, v, causal):
        with sdpa.patch_sdpa():
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)

    return {
        "attention": lambda q, k, v, c: rocmflash.attention(q, k, v, causal=c),
        "flash_attn_func": lambda q, k, v, c: rocmflash.flash_attn_func(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=c).transpose(1, 2),
        "torch_op": lambda q, k, v, c: torch.ops.rocmflash.attn_fwd(q, k, v, c, 1 / math.sqrt(q.shape[-1]),
                                                                    "online", "")[0],
        "patch_sdpa": patched,
    }


@pytest.mark.parametrize("entry", ["attention", "flash_attn_func", "torch_op", "patch_sdpa"])
@pytest.mark.parametrize("Sq,group,causal", [(1, 4, False), (1, 4, True), (3, 8, True), (16, 1, False)])
def test_decode_shaped_calls_run_the_decode_kernel(interpret, entry, Sq, group, causal):
    from rocmflash.kernels.launch import observe_launches

    if entry == "patch_sdpa" and causal:
        pytest.skip("SDPA's is_causal is top-left aligned for Sq != Sk: patch_sdpa hands those back to SDPA")
    q, k, v = _bhsd(2, Sq, 300, 2 * group, 2, 32, seed=Sq * 10 + group)
    with observe_launches() as seen:
        out = _entry_points()[entry](q, k, v, causal)
    kernels = {r["kernel"] for r in seen}
    assert "_decode_split" in kernels and not any(n.startswith("_attn") for n in kernels), kernels
    ref, _ = _ref(q, k, v, causal)
    assert out.shape == q.shape and torch.isfinite(out).all()
    assert rel_err(out, ref) < TOL, rel_err(out, ref)


def test_decode_route_lse_and_gradients(interpret):
    """The LSE the decode kernel writes feeds the dense backward: gradients as the fp64 reference."""
    import rocmflash
    from rocmflash.kernels.launch import observe_launches

    q, k, v = _bhsd(1, 2, 400, 8, 2, 32, seed=5)
    for t in (q, k, v):
        t.requires_grad_(True)
    with observe_launches() as seen:
        out, lse = rocmflash.attention(q, k, v, causal=True, return_lse=True)
    assert "_decode_split" in {r["kernel"] for r in seen}
    qd, kd, vd = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    ref, ref_lse = _ref(qd, kd, vd, True)
    assert rel_err(out, ref) < TOL and (lse.double() - ref_lse).abs().max() < 1e-3
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).half()
    (out.float() * dout.float()).sum().backward()
    (ref * dout.double()).sum().backward()
    for name, got, want in (("dq", q.grad, qd.grad), ("dk", k.grad, kd.grad), ("dv", v.grad, vd.grad)):
        assert rel_err(got, want) < 2e-2, name


def test_decode_route_strided_views_and_repeat_calls(interpret):
    """Non-contiguous inputs (a (B, S, H, D) buffer seen as (B, H, S, D)), the kept plan on the second
    call, and an output in q's layout."""
    import rocmflash

    for seed in (1, 2):  # the second call replays the kept plan with fresh values
        gen = torch.Generator().manual_seed(seed)
        q = torch.randn(2, 1, 8, 32, generator=gen).half().transpose(1, 2)
        k = torch.randn(2, 512, 2, 32, generator=gen).half().transpose(1, 2)
        v = torch.randn(2, 512, 2, 32, generator=gen).half().transpose(1, 2)
        out = rocmflash.attention(q, k, v)
        ref, _ = _ref(q, k, v, False)
        assert rel_err(out, ref) < TOL


@pytest.mark.parametrize("Sq,Sk,group", [(1, 128, 4), (32, 2048, 4), (17, 4096, 4), (64, 300, 1)])
def test_other_shapes_stay_on_the_dense_kernel(interpret, Sq, Sk, group):
    from rocmflash.kernels.decode.shape import is_decode_shaped

    assert not is_decode_shaped(Sq, Sk, group)


def test_explicit_variant_or_config_is_honoured(interpret):
    """A caller who names a variant or a config gets that kernel, decode-shaped or not."""
    import rocmflash
    from rocmflash.config import default_config
    from rocmflash.kernels.launch import observe_launches

    q, k, v = _bhsd(1, 1, 300, 4, 1, 32, seed=9)
    with observe_launches() as seen:
        rocmflash.attention(q, k, v, variant="split_kv")
        rocmflash.attention(q, k, v, config=default_config("gfx942", 32, "online"))
    assert "_decode_split" not in {r["kernel"] for r in seen}
