"""The static phase's compile workers cross-compile without importing torch (issue #29: a cold tune's first
seconds). Each is a fresh process per static phase; torch's import costs seconds of CPU in every one of them,
on the cores the cross-compiles need. (Triton 3.6's AMD backend imports torch itself when it specialises a
pointer argument, ``HIPBackend.is_within_2gb``: an AMD cross-compile still does; an NVIDIA one does not.)"""

import subprocess
import sys

_SCRIPT = """
import sys
from rocmflash.static import compile as SC, families
from rocmflash.tuning import backward, decode, varlen, varlen_bwd
from rocmflash.kernels.backward import host as KB
from rocmflash.kernels.decode import host as KD
from rocmflash.kernels.forward import split_kv as split_kv
from rocmflash.kernels.varlen import host as KV
from rocmflash.kernels.decode import quant as kv_quant
from rocmflash.kernels.decode import append as kv_append
from rocmflash.kernels.forward import online as online
from rocmflash.hw import fp8
assert "torch" not in sys.modules, "importing the compile path imported torch"
cfg = KD.DecodeConfig(BLOCK_N=64, num_warps=4, num_stages=1)
split, combine = KD.compile_for("sm_90", cfg, 128, "bf16", group=4)
fp8_split, _ = KD.compile_for("sm_90", cfg, 128, "bf16", group=4, kv_dtype="fp8e4nv")
assert split.asm["ptx"] and fp8_split.asm["ptx"]
assert "torch" not in sys.modules, "cross-compiling imported torch"
print("ok")
"""


def test_the_compile_path_and_a_cross_compile_import_no_torch(tmp_path):
    env = {"TRITON_CACHE_DIR": str(tmp_path / "triton"), "PATH": "/usr/bin:/bin"}
    import os

    env.update({k: v for k, v in os.environ.items() if k not in env and not k.startswith("TRITON_")})
    out = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


def test_the_torch_free_fp8_family_table_says_what_the_torch_table_says():
    from rocmflash.hw import fp8 as F8

    assert {F8.triton_type(d): family for d, (family, *_rest) in F8.FP8_DTYPES.items()} == F8.TRITON_FAMILY
