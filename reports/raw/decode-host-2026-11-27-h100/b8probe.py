"""Which kernels rocmflash.attention runs for a decode-shaped call at B8 KV8k (decode_entry: 0.83x on 2026-11-27)."""
import os, sys, json
import torch
import rocmflash
from rocmflash.api import selection
from torch.profiler import profile, ProfilerActivity

out = os.environ.get("OUT", ".")
rows = []
for B, L in ((8, 8192), (8, 32768), (1, 8192)):
    dev, dt, Hq, Hkv, D = "cuda", torch.bfloat16, 32, 8, 128
    q = torch.randn(B, 1, Hq, D, device=dev, dtype=dt)
    kc = torch.randn(B, L, Hkv, D, device=dev, dtype=dt)
    vc = torch.randn_like(kc)
    lens = torch.full((B,), L, dtype=torch.int32, device=dev)
    qs, ks, vs = q.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2)
    paths = {"attention": lambda: rocmflash.attention(qs, ks, vs),
             "kvcache": lambda: rocmflash.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens),
             "sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, enable_gqa=True)}
    for name, fn in paths.items():
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
        kern = {}
        for e in prof.key_averages():
            t = getattr(e, "device_time", None) or getattr(e, "cuda_time", 0.0)
            if t and e.count:
                kern[e.key[:60]] = (e.count, round(float(t), 2))
        rows.append({"B": B, "L": L, "path": name, "kernels": kern})
        print(B, L, name, json.dumps(kern))
try:
    from rocmflash.api import decode_choice
    print("decode_incumbent attr:", [n for n in dir(decode_choice) if "incumb" in n.lower()])
except Exception as e:
    print("no decode_choice", e)
json.dump(rows, open(os.path.join(out, "b8probe.json"), "w"), indent=1)
