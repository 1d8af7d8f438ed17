"""The decode kernel's fused merge (``kv_decode.FUSED_COMBINE``): one launch whose last split program per
(sequence, K/V head) merges the partials, in Triton's interpreter, against the fp64 reference of
``test_kvcache_interp.run_case`` (contiguous and paged caches, GQA, several tokens, windows, soft-capping,
empty rows, LSE). Also: exactly one decode launch per call, the arrival counts back at zero after every
launch (so a later launch with another split count or batch starts clean), one count buffer per stream,
and the two-launch path kept while a CUDA graph is captured.

The interpreter runs programs one after another, so these tests check the merge's arithmetic and its
bookkeeping, not the ordering between programs that a GPU needs (the GPU tests in ``test_kvcache_gpu.py``
run the same cases with the flag on)."""

import math

import pytest
import torch

from test_kvcache_interp import run_case
from varlen_reference import attention_fp64, rel_err


@pytest.fixture
def fused(monkeypatch):
    from rocmflash.api import decode
    from rocmflash.kernels.decode import host as KD

    monkeypatch.setattr(KD, "FUSED_COMBINE", True)
    monkeypatch.setattr(KD, "_ARRIVALS", {})
    decode.clear_cache()
    yield KD
    decode.clear_cache()


def _counts_are_zero(KD):
    assert KD._ARRIVALS, "no fused launch ran"
    for counts in KD._ARRIVALS.values():
        assert int(counts.abs().sum()) == 0, counts[:16]


@pytest.mark.parametrize("page,group,splits", [(0, 1, 3), (0, 8, 5), (16, 4, 2), (1, 4, 7), (64, 8, 4)])
def test_fused_merge_matches_the_reference(interpret, fused, page, group, splits):
    from rocmflash.kernels.common import observe_launches

    with observe_launches() as seen:
        run_case([0, 1, 57, 90], 1, group, 64, torch.bfloat16, page, seed=41 + page + group, num_splits=splits)
    kernels = [r["kernel"] for r in seen]
    assert kernels == ["_append_rows", "_decode_split"], kernels  # no combine launch
    _counts_are_zero(fused)


@pytest.mark.parametrize("causal", [False, True])
def test_fused_several_tokens_window_softcap_and_empty_rows(interpret, fused, causal):
    run_case([5, 33, 80], 4, 4, 80, torch.float16, 16, causal=causal, seed=43 + causal, num_splits=3)
    run_case([40, 90], 2, 2, 64, torch.bfloat16, 16, causal=True, window=(20, -1), softcap=8.0, num_splits=2,
             seed=45)
    run_case([0, 2, 40], 4, 2, 64, torch.float16, 0, causal=True, append=False, num_splits=3, seed=47)
    _counts_are_zero(fused)


def test_fused_and_two_launch_paths_agree(interpret, fused, monkeypatch):
    """Same inputs, both paths, several split counts and batches in a row (the counts must start at zero
    whatever the last launch's split count was): outputs and LSEs agree to fp32 rounding."""
    from rocmflash import flash_attn_with_kvcache

    gen = torch.Generator().manual_seed(53)
    for B, splits in ((3, 4), (1, 7), (5, 2), (3, 3)):
        q = torch.randn(B, 1, 8, 64, generator=gen).to(torch.bfloat16)
        kc = torch.randn(B, 120, 2, 64, generator=gen).to(torch.bfloat16)
        vc = torch.randn(B, 120, 2, 64, generator=gen).to(torch.bfloat16)
        lens = torch.randint(1, 121, (B,), generator=gen, dtype=torch.int32)
        got, got_lse = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, num_splits=splits, return_lse=True)
        _counts_are_zero(fused)
        monkeypatch.setattr(fused, "FUSED_COMBINE", False)
        want, want_lse = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, num_splits=splits,
                                                 return_lse=True)
        monkeypatch.setattr(fused, "FUSED_COMBINE", True)
        assert rel_err(got, want) < 1e-2
        assert (got_lse - want_lse).abs().max().item() < 1e-4
        for b in range(B):
            n = int(lens[b])
            ref, _ = attention_fp64(q[b], kc[b, :n], vc[b, :n], 1 / math.sqrt(64))
            assert rel_err(got[b], ref) < 2.5e-2


def test_dense_decode_entry_uses_the_fused_launch(interpret, fused):
    """``rocmflash.attention`` on a decode-shaped call (one token, GQA 4, 512 keys) runs the same kernel."""
    import rocmflash
    from rocmflash.kernels.common import observe_launches

    gen = torch.Generator().manual_seed(59)
    q = torch.randn(2, 8, 1, 64, generator=gen).to(torch.float16)
    k = torch.randn(2, 2, 512, 64, generator=gen).to(torch.float16)
    v = torch.randn(2, 2, 512, 64, generator=gen).to(torch.float16)
    with observe_launches() as seen:
        out = rocmflash.attention(q, k, v)
    kernels = [r["kernel"] for r in seen]
    if "_decode_split" not in kernels:
        pytest.skip(f"this call did not route to the decode kernel here: {kernels}")
    assert "_decode_combine" not in kernels, kernels
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float().repeat_interleave(4, 1),
                                                           v.float().repeat_interleave(4, 1))
    assert rel_err(out, ref) < 1e-2


def test_one_count_buffer_per_stream_grown_as_needed(fused):
    """Counts are keyed by (device, stream) and grow (zeroed) when a launch has more groups than they hold."""
    small = fused.arrival_counts(torch.device("cpu"), 10)
    assert small.dtype == torch.int32 and small.numel() >= 10 and int(small.abs().sum()) == 0
    assert fused.arrival_counts(torch.device("cpu"), 200) is small  # fits: the same buffer
    big = fused.arrival_counts(torch.device("cpu"), 5000)
    assert big.numel() >= 5000 and int(big.abs().sum()) == 0
    assert fused.arrival_counts(torch.device("cpu"), 10) is big


def test_graph_capture_keeps_the_two_launch_path(interpret, fused, monkeypatch):
    """While a graph is captured the fused launch is not used (its counts would live in the graph's pool)."""
    from rocmflash.kernels import error_words as EW
    from rocmflash.kernels.common import observe_launches

    monkeypatch.setattr(fused.EW, "capturing", lambda device: True)
    assert fused.EW is EW
    with observe_launches() as seen:
        run_case([20, 70], 1, 4, 64, torch.bfloat16, 0, append=False, num_splits=3, seed=61)
    kernels = [r["kernel"] for r in seen]
    assert kernels == ["_decode_split", "_decode_combine"], kernels
