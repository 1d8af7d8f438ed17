"""rocmflash.api.select: one choose() for every family, one clear(), and override() as the one way to force a
config -- checked through the public entry points in Triton's interpreter (the forced config reaches the kernel,
the answer stays right, and nothing of the override outlives it)."""

import pytest
import torch

from rocmflash.api import selection
from rocmflash.api.select import FAMILIES, SELECTOR, Choice
from rocmflash.config import KernelConfig
from rocmflash.kernels.common import observe_launches
from rocmflash.kernels.decode.host import DecodeConfig

CPU = torch.device("cpu")
PROBLEMS = {
    "forward": dict(head_dim=64, dtype=torch.float16, causal=True, gqa_ratio=2, seqlen_q=128, seqlen_k=128),
    "backward": dict(head_dim=64, dtype=torch.float16, causal=True, gqa_ratio=2, seqlen_k=128),
    "varlen": dict(head_dim=64, dtype=torch.float16, causal=True, gqa_ratio=2, max_seqlen_k=128),
    "varlen_bwd": dict(head_dim=64, dtype=torch.float16, causal=True, gqa_ratio=2, max_seqlen_k=128),
    "decode": dict(head_dim=64, dtype=torch.float16, group=2, seqlen_k=512, batch=2),
    "fp8": dict(head_dim=64, dtype=torch.float8_e4m3fn, causal=True, gqa_ratio=2, seqlen_k=128),
}


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    monkeypatch.setenv(selection.NO_DB_ENV, "1")  # defaults only: no database on this box answers
    SELECTOR.clear()
    yield
    SELECTOR.clear()


def _rel_err(out, ref):
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


@pytest.mark.parametrize("family", FAMILIES)
def test_choose_answers_every_family_with_the_selectors_own_config(family):
    choice = SELECTOR.choose(family, PROBLEMS[family], CPU)
    assert isinstance(choice, Choice) and choice.family == family and choice.served_by == "rocmflash"
    kinds = {"forward": KernelConfig, "varlen": KernelConfig, "decode": DecodeConfig, "fp8": KernelConfig}
    if family in kinds:
        assert isinstance(choice.config, kinds[family])
    else:
        assert hasattr(choice.config, "dq") and hasattr(choice.config, "dkdv")
    assert choice.source != "override"


def test_bad_families_and_problems_are_one_clear_line():
    with pytest.raises(ValueError, match="family='fwd' is unknown; expected one of"):
        SELECTOR.choose("fwd", PROBLEMS["forward"], CPU)
    with pytest.raises(ValueError, match=r"missing \['seqlen_q'\], unknown \['seqlen'\]"):
        SELECTOR.choose("forward", dict(PROBLEMS["backward"], seqlen=3), CPU)
    with pytest.raises(ValueError, match="family='x' is unknown"):
        with SELECTOR.override("x", None):
            pass


def test_clear_forgets_every_kept_choice():
    SELECTOR.choose("forward", PROBLEMS["forward"], CPU)
    assert selection._FWD
    SELECTOR.clear()
    assert not selection._FWD


def _decode_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    B, S, Hkv, G, D = 2, 512, 2, 2, 64
    q = torch.randn(B, 1, Hkv * G, D, generator=g).half()
    k = torch.randn(B, S, Hkv, D, generator=g).half()
    v = torch.randn(B, S, Hkv, D, generator=g).half()
    lens = torch.tensor([300, 512], dtype=torch.int32)
    ref = []
    for b in range(B):
        L = int(lens[b])
        kk = k[b, :L].float().transpose(0, 1).repeat_interleave(G, 0)
        vv = v[b, :L].float().transpose(0, 1).repeat_interleave(G, 0)
        ref.append(torch.nn.functional.scaled_dot_product_attention(q[b].float().transpose(0, 1), kk, vv)
                   .transpose(0, 1))
    return q, k, v, lens, torch.stack(ref)


def test_a_decode_override_reaches_the_kernel_and_ends_with_the_block(interpret, fresh_decode):
    import rocmflash

    q, k, v, lens, ref = _decode_inputs(seed=11)
    default = SELECTOR.choose("decode", PROBLEMS["decode"], CPU).config
    forced = DecodeConfig(BLOCK_N=16, num_warps=2, num_stages=1, num_splits=3)
    assert (forced.num_warps, forced.num_stages) != (default.num_warps, default.num_stages)
    with SELECTOR.override("decode", forced.to_dict()):
        choice = SELECTOR.choose("decode", PROBLEMS["decode"], CPU)
        assert choice.config == forced and choice.source == "override"
        with observe_launches() as seen:
            out = rocmflash.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens)
    split = [r for r in seen if r["kernel"] == "_decode_split"]
    assert split and split[0]["options"]["num_warps"] == 2 and split[0]["options"]["num_stages"] == 1
    assert _rel_err(out, ref) < 1e-2
    assert SELECTOR.choose("decode", PROBLEMS["decode"], CPU).config == default  # nothing kept past the block
    with observe_launches() as seen:
        again = rocmflash.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens)
    split = [r for r in seen if r["kernel"] == "_decode_split"]
    assert split and split[0]["options"]["num_warps"] == default.num_warps
    assert _rel_err(again, ref) < 1e-2


def test_a_forward_override_serves_rocmflash_and_nests(interpret):
    import rocmflash

    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 2, 64, 32, generator=g).half()
    k = torch.randn(1, 2, 64, 32, generator=g).half()
    v = torch.randn(1, 2, 64, 32, generator=g).half()
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    outer, inner = KernelConfig(BLOCK_M=32, BLOCK_N=16), KernelConfig(BLOCK_M=16, BLOCK_N=32)
    problem = dict(PROBLEMS["forward"], head_dim=32, gqa_ratio=1, seqlen_q=64, seqlen_k=64)
    with SELECTOR.override("forward", outer):
        with SELECTOR.override("forward", inner):
            assert SELECTOR.choose("forward", problem, CPU).config == inner
            out = rocmflash.attention(q, k, v, causal=True)
        assert SELECTOR.choose("forward", problem, CPU) == Choice("forward", outer, "override", "rocmflash")
        assert selection.select_incumbent(CPU, 32, torch.float16, True, 1, 64) is None
    assert selection.overridden("forward") is None
    assert _rel_err(out, ref) < 1e-2


def test_fp8_family_chooses_the_fp8_default_and_takes_an_override(monkeypatch):
    """``choose("fp8", ...)``: the fp8 kernel's per-arch default where no entry of the format exists; under
    ``override("fp8", cfg)`` that config, for ``choose`` and for the run-time selection the fp8 call makes."""
    import torch

    from rocmflash.api import selection
    from rocmflash.api.select import SELECTOR
    from rocmflash.api.selection_fp8 import select_fp8_config
    from rocmflash.config import KernelConfig
    from rocmflash.kernels.fp8.forward import default_config

    monkeypatch.setenv(selection.NO_DB_ENV, "1")
    monkeypatch.setattr(selection, "device_identity", lambda device: ("mi300x", "gfx942"))
    problem = {"head_dim": 128, "dtype": torch.float8_e4m3fnuz, "causal": True, "gqa_ratio": 4, "seqlen_k": 4096}
    SELECTOR.clear()
    choice = SELECTOR.choose("fp8", problem, torch.device("cpu"))
    assert choice.source == "default" and choice.served_by == "rocmflash"
    assert choice.config == default_config("gfx942", 128)
    forced = KernelConfig(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=1)
    with SELECTOR.override("fp8", forced.to_dict()):
        assert SELECTOR.choose("fp8", problem, torch.device("cpu")).config == forced
        assert select_fp8_config(torch.device("cpu"), 128, torch.float8_e4m3fnuz, True, 4, 4096) == forced
    assert SELECTOR.choose("fp8", problem, torch.device("cpu")).source == "default"
    SELECTOR.clear()
