"""Does a decode call wait on the GPU? Host time against wall time of back-to-back calls, and the CPU-side CUDA calls.

For B/KV in (8, 8192), (1, 8192), (8, 32768) (Hq 32, Hkv 8, D 128, bf16, one query token), three rounds of
100 back-to-back calls of ``rocmflash.attention``, ``flash_attn_with_kvcache`` (default call) and SDPA: "host"
is the loop's time without a synchronise, "wall" with one at its end (µs per call). A path whose host time
equals its wall time is host-bound; one that waits on the GPU shows host = wall as well, so the profile of
20 calls lists the CUDA runtime calls each path makes on the CPU (synchronising ones included).
Writes ``$OUT/syncprobe.json``. On a GPU::

    OUT=. python bench/decode_host_wall.py
"""
import json, os, time
import torch
import rocmflash
from torch.profiler import profile, ProfilerActivity

out = os.environ.get("OUT", ".")
res = {}
print(torch.cuda.get_device_name())
for B, L in ((8, 8192), (1, 8192), (8, 32768)):
    Hq, Hkv, D, dt = 32, 8, 128, torch.bfloat16
    q = torch.randn(B, 1, Hq, D, device="cuda", dtype=dt)
    kc = torch.randn(B, L, Hkv, D, device="cuda", dtype=dt)
    vc = torch.randn_like(kc)
    lens = torch.full((B,), L, dtype=torch.int32, device="cuda")
    qs, ks, vs = q.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2)
    paths = {"attention": lambda: rocmflash.attention(qs, ks, vs),
             "kvcache": lambda: rocmflash.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens),
             "sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, enable_gqa=True)}
    for rnd in range(3):
        for name, fn in paths.items():
            for _ in range(5):
                fn()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(100):
                fn()
            host = (time.perf_counter() - t0) / 100 * 1e6
            torch.cuda.synchronize()
            wall = (time.perf_counter() - t0) / 100 * 1e6
            res.setdefault(f"B{B} L{L} {name}", []).append((round(host, 1), round(wall, 1)))
    for name, fn in paths.items():
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
        calls = {e.key: e.count for e in prof.key_averages() if e.key.startswith("cuda") or "item" in e.key or "Sync" in e.key or "Memcpy" in e.key or "nonzero" in e.key}
        res[f"B{B} L{L} {name} cpu-calls"] = calls
for k, v in res.items():
    print(k, v)
json.dump(res, open(os.path.join(out, "syncprobe.json"), "w"), indent=1)
