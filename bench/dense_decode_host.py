"""Host time of a decode-shaped dense call against ``flash_attn_with_kvcache`` on the same cache, on a CPU with
the launches stubbed out (``bench/host_profile.py``'s stub): what rocmflash's own Python costs per call.

B8, Hq 32, Hkv 8, D 128, bf16, one query token over 8192 keys. Rows, thread CPU µs per call (median of
``--rounds`` loops of 1000 calls, all rows interleaved):
- ``attention``: ``rocmflash.attention`` on ``(B, H, S, D)`` views (the dense route to the decode kernel);
- ``kvcache``: ``flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens)`` (the default call);
- ``whole``: ``attend_whole_cache`` called directly, without a dense plan;
- ``transposes``: the four ``transpose`` calls the dense route makes, alone.

``--code DIR`` imports rocmflash (and the stub) from another checkout, for an A/B in alternating processes::

    python bench/dense_decode_host.py --code /tmp/before --label before --out DIR
    python bench/dense_decode_host.py --label after --out DIR

Writes ``DIR/dense-decode-host-LABEL.json``.
"""
import argparse
import json
import os
import statistics
import sys
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--code", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    help="the checkout to import rocmflash and bench/host_profile.py from")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--label", default="run")
    ap.add_argument("--out", default=".")
    args = ap.parse_args(argv)
    sys.path[:0] = [args.code, os.path.join(args.code, "bench")]
    import host_profile
    import torch

    import rocmflash
    from rocmflash.api import decode

    host_profile._stub_launches("rocmflash")
    B, L, Hq, Hkv, D = 8, 8192, 32, 8, 128
    q = torch.randn(B, 1, Hq, D, dtype=torch.bfloat16)
    kc, vc = (torch.randn(B, L, Hkv, D, dtype=torch.bfloat16) for _ in range(2))
    lens = torch.full((B,), L, dtype=torch.int32)
    qs, ks, vs = q.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2)
    out = torch.empty_like(q)

    def attention():
        with torch.no_grad():
            rocmflash.attention(qs, ks, vs)

    def kvcache():
        with torch.no_grad():
            rocmflash.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens)

    def whole():
        with torch.no_grad():
            decode.attend_whole_cache(q, kc, vc, D ** -0.5, False, out)

    def transposes():
        qs.transpose(1, 2), ks.transpose(1, 2), vs.transpose(1, 2), out.transpose(1, 2)

    rows = {"attention": attention, "kvcache": kvcache, "whole": whole, "transposes": transposes}
    for _ in range(200):  # plans kept, caches warm
        for fn in rows.values():
            fn()
    samples = {name: [] for name in rows}
    for _ in range(args.rounds):
        for name, fn in rows.items():
            t0 = time.thread_time()
            for _ in range(args.calls):
                fn()
            samples[name].append((time.thread_time() - t0) / args.calls * 1e6)
    result = {name: round(statistics.median(v), 1) for name, v in samples.items()}
    result["attention / kvcache"] = round(result["attention"] / result["kvcache"], 2)
    result.update(label=args.label, code=args.code, rocmflash=rocmflash.__file__, torch=torch.__version__)
    print(json.dumps(result))
    with open(os.path.join(args.out, f"dense-decode-host-{args.label}.json"), "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
