"""GPU: attention sinks (``s_aux``) in ``flash_attn_with_kvcache``, compiled, against the fp64 eager formula of
``test_decode_sinks_interp`` (contiguous and paged, one split and several, the fused merge on and off, GQA 8:1,
D=128, bf16 and fp32 sinks). Each call is made three times, with and without sinks in turn, so the kept launch
plans (``kernels.launch``: not run by the interpreter) replay with the sink pointer, and a plan of one kind
never serves the other."""

import math

import pytest
import torch

from test_decode_sinks_interp import sink_attention_fp64
from varlen_reference import rel_err

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("compiled")]


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("page,splits", [(0, 1), (0, 4), (16, 3), (256, 0)])
@pytest.mark.parametrize("window", [-1, 4, 300], ids=["no-window", "window5", "window301"])
def test_gpu_decode_sinks_match_the_eager_formula(monkeypatch, fused, page, splits, window):
    from rocmflash import flash_attn_with_kvcache
    from rocmflash.api import decode
    from rocmflash.api.decode import check_errors
    from rocmflash.kernels.decode import host as KD

    monkeypatch.setattr(KD, "FUSED_COMBINE", fused)
    decode.clear_cache()
    gen = torch.Generator(device="cuda").manual_seed(page + splits + 10 * fused)
    B, L, Hq, Hkv, D = 3, 1500, 16, 2, 128
    if page:
        pages = -(-L // page)
        kc = torch.randn(B * pages + 2, page, Hkv, D, device="cuda", generator=gen).to(torch.bfloat16)
        table = torch.randperm(B * pages + 2, device="cuda", generator=gen)[:B * pages].view(B, pages).int()
    else:
        kc, table = torch.randn(B, L, Hkv, D, device="cuda", generator=gen).to(torch.bfloat16), None
    vc = torch.randn_like(kc.float()).to(torch.bfloat16)
    lens = torch.tensor([0, 700, L - 1], dtype=torch.int32, device="cuda")
    q = torch.randn(B, 1, Hq, D, device="cuda", generator=gen).to(torch.bfloat16)
    sinks = torch.randn(Hq, device="cuda", generator=gen) * 1.5 + 1.0
    for use in (sinks, None, sinks.to(torch.bfloat16)):
        out, lse = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table, causal=True,
                                           num_splits=splits, return_softmax_lse=True, s_aux=use,
                                           window_size=(window, -1))
        torch.cuda.synchronize()
        check_errors()
        ref_sinks = use if use is not None else torch.full((Hq,), float("-inf"), device="cuda")
        for b in range(B):
            n = int(lens[b])
            if table is None:
                k, v = kc[b, :n], vc[b, :n]
            else:
                idx = torch.arange(n, device="cuda")
                k, v = (c[table[b][idx // page].long(), idx % page] for c in (kc, vc))
            ref, ref_lse = sink_attention_fp64(q[b], k, v, ref_sinks, 1 / math.sqrt(D), causal=True,
                                               window=(window, -1))
            if n == 0 and use is None:  # no key, no sink: output 0, LSE -inf
                assert (out[b] == 0).all() and torch.isinf(lse[b]).all()
                continue
            assert rel_err(out[b], ref) < 2e-2, (b, use is None)
            assert (lse[b].double() - ref_lse).abs().max().item() < 1e-3, (b, use is None)
