"""GPU: the fused decode merge (``kv_decode.FUSED_COMBINE``) against the two-launch path, many times over.

On a GPU the split programs of one (sequence, K/V head) run at once and the last to arrive merges the others'
partials, so a missing release/acquire shows up as an intermittently wrong row. Every case repeats its call
and compares each result with the two-launch answer of the same inputs; decodes on two streams at once check
that each stream has its own arrival counts; the counts are zero after every launch."""

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("compiled")]


@pytest.fixture
def fused(monkeypatch):
    from rocmflash.api import decode
    from rocmflash.kernels.decode import host as KD

    monkeypatch.setattr(KD, "FUSED_COMBINE", True)
    decode.clear_cache()
    yield KD
    decode.clear_cache()


def _inputs(B, L, Hq, Hkv, D, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, 1, Hq, D, device="cuda", generator=gen).to(torch.bfloat16)
    kc = torch.randn(B, L, Hkv, D, device="cuda", generator=gen).to(torch.bfloat16)
    vc = torch.randn(B, L, Hkv, D, device="cuda", generator=gen).to(torch.bfloat16)
    lens = torch.randint(L // 2, L + 1, (B,), device="cuda", generator=gen).int()
    return q, kc, vc, lens


@pytest.mark.parametrize("B,L,Hkv", [(1, 2048, 8), (1, 65536, 8), (8, 8192, 8), (32, 4096, 8), (4, 3000, 32)])
def test_fused_equals_two_launches_every_time(fused, monkeypatch, B, L, Hkv):
    from rocmflash import flash_attn_with_kvcache

    q, kc, vc, lens = _inputs(B, L, 32, Hkv, 128, B + L + Hkv)
    monkeypatch.setattr(fused, "FUSED_COMBINE", False)
    want, want_lse = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, return_lse=True)
    monkeypatch.setattr(fused, "FUSED_COMBINE", True)
    for _ in range(200):
        got, got_lse = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, return_lse=True)
        assert ((got.float() - want.float()).abs().max() <= 1e-2 * want.float().abs().max()).item()
        assert ((got_lse - want_lse).abs().max() < 1e-4).item()
    for counts in fused._ARRIVALS.values():
        assert int(counts.abs().sum()) == 0


def test_two_streams_at_once_keep_their_own_counts(fused):
    from rocmflash import flash_attn_with_kvcache

    cases = [_inputs(2, 16384, 32, 8, 128, seed) for seed in (1, 2)]
    wants = [flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens) for q, kc, vc, lens in cases]
    streams = [torch.cuda.Stream() for _ in cases]
    torch.cuda.synchronize()
    outs = [[], []]
    for _ in range(50):
        for i, ((q, kc, vc, lens), s) in enumerate(zip(cases, streams)):
            with torch.cuda.stream(s):
                outs[i].append(flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens))
    torch.cuda.synchronize()
    for want, got in zip(wants, outs):
        for out in got:
            assert torch.allclose(out.float(), want.float(), atol=1e-2, rtol=0)
    assert len(fused._ARRIVALS) >= 2  # one buffer per stream (and the default stream's)


@pytest.mark.parametrize("B,L,Hkv,kernels", [(1, 2048, 8, ["_decode_split"]), (1, 8192, 8, ["_decode_split"]),
                                             (8, 8192, 8, ["_decode_split", "_decode_combine"]),
                                             (1, 8192, 32, ["_decode_split", "_decode_combine"])])
def test_the_shipped_rule_fuses_small_caches_only(monkeypatch, B, L, Hkv, kernels):
    """The default (``FUSED_COMBINE`` None): a cache of at most ``FUSED_AUTO_MAX_KV_BYTES`` is one launch, a larger
    one split + combine; every repeat call gives the forced two-launch answer of the same random inputs."""
    from rocmflash import flash_attn_with_kvcache
    from rocmflash.api import decode
    from rocmflash.kernels.decode import host as KD
    from rocmflash.kernels.launch import observe_launches

    monkeypatch.setattr(KD, "FUSED_COMBINE", None)
    decode.clear_cache()
    q, kc, vc, lens = _inputs(B, L, 32, Hkv, 128, 7 * B + Hkv)
    with observe_launches() as seen:
        got, got_lse = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, return_lse=True, num_splits=4)
    assert [r["kernel"] for r in seen] == kernels
    monkeypatch.setattr(KD, "FUSED_COMBINE", False)
    want, want_lse = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, return_lse=True, num_splits=4)
    monkeypatch.setattr(KD, "FUSED_COMBINE", None)
    for _ in range(50):  # repeat calls, replayed from kept plans
        got, got_lse = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, return_lse=True, num_splits=4)
        assert ((got.float() - want.float()).abs().max() <= 1e-2 * want.float().abs().max()).item()
        assert ((got_lse - want_lse).abs().max() < 1e-4).item()
    decode.clear_cache()


@pytest.mark.parametrize("paged", [False, True])
def test_the_rule_fuses_a_small_fp8_cache_and_gives_the_two_launch_answer(monkeypatch, paged):
    """An fp8 cache of at most ``FUSED_AUTO_MAX_KV_BYTES`` (B1, 4k keys, GQA 4) under the shipped rule: one launch,
    with a one-token append (quantised into the cache), equal to the forced two-launch call on a copy of the cache."""
    from rocmflash import flash_attn_with_kvcache
    from rocmflash.api import decode
    from rocmflash.kernels.decode import host as KD
    from rocmflash.kernels.launch import observe_launches

    gen = torch.Generator(device="cuda").manual_seed(3 + paged)
    B, L, Hq, Hkv, D, page = 1, 4096, 32, 8, 128, 256
    fp8 = torch.float8_e4m3fn
    q = torch.randn(B, 1, Hq, D, device="cuda", generator=gen).to(torch.bfloat16)
    kn, vn = (torch.randn(B, 1, Hkv, D, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(2))
    shape = (B * L // page, page, Hkv, D) if paged else (B, L, Hkv, D)
    kc, vc = ((torch.randn(shape, device="cuda", generator=gen) * 2).to(fp8) for _ in range(2))
    table = torch.randperm(B * L // page, device="cuda", generator=gen).int().view(B, -1) if paged else None
    kd, vd = (torch.rand(B, Hkv, device="cuda", generator=gen) + 0.5 for _ in range(2))
    lens = torch.tensor([L - 700], dtype=torch.int32, device="cuda")

    def call(k_cache, v_cache):
        return flash_attn_with_kvcache(q, k_cache, v_cache, kn, vn, cache_seqlens=lens, block_table=table,
                                       k_descale=kd, v_descale=vd, num_splits=4, return_lse=True)

    monkeypatch.setattr(KD, "FUSED_COMBINE", False)
    decode.clear_cache()
    want, want_lse = call(kc.clone(), vc.clone())
    monkeypatch.setattr(KD, "FUSED_COMBINE", None)
    decode.clear_cache()
    assert 2 * kc.numel() * kc.element_size() <= KD.FUSED_AUTO_MAX_KV_BYTES
    with observe_launches() as seen:
        got, got_lse = call(kc.clone(), vc.clone())
    assert [r["kernel"] for r in seen if r["kernel"].startswith("_decode")] == ["_decode_split"]
    for _ in range(30):
        got, got_lse = call(kc.clone(), vc.clone())
        assert ((got.float() - want.float()).abs().max() <= 1e-2 * want.float().abs().max()).item()
        assert ((got_lse - want_lse).abs().max() < 1e-4).item()
    decode.clear_cache()
