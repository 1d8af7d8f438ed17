"""Host cost, on the CPU, of the two per-call steps a kept decode call pays before its launches: the call's
signature (``api.decode._signature``) and one kept launch key (``kernels.launch.kept_key``, 12 tensors, some one
object as the decode stand-ins are). Usage: ``python benchmarks/diag/kept_key_cost.py [TREE]`` (TREE: a checkout
to import rocmflash from; default this one), e.g. run it in two trees to compare."""

import os
import sys
import timeit

sys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))

import torch  # noqa: E402

from rocmflash.api import decode as AD  # noqa: E402
from rocmflash.config import KernelConfig  # noqa: E402
from rocmflash.kernels import launch as L  # noqa: E402
from rocmflash.kernels.backward.host import _bwd_dq  # noqa: E402


def main() -> None:
    q = torch.empty(1, 1, 32, 128, dtype=torch.bfloat16)
    kc, vc = (torch.empty(1, 8192, 4, 128, dtype=torch.bfloat16) for _ in range(2))
    lens = torch.full((1,), 8191, dtype=torch.int32)
    call = (q, kc, vc, None, None, lens, None, None, None, None, None, None)
    launch = (q, kc, vc, lens, lens, lens, q, q, lens, lens, lens, lens)
    keys: dict = {}
    steps = {"_signature": lambda: AD._signature("cuda", call, (None, True, 0.0, 0, False), (-1, -1)),
             "kept_key": lambda: L.kept_key(keys, ("slot",), _bwd_dq, (), launch, KernelConfig(), "cuda")}
    for name, step in steps.items():
        best = min(timeit.repeat(step, number=20000, repeat=5)) / 20000 * 1e6
        print(f"{name}: {best:.2f} µs")


if __name__ == "__main__":
    main()
