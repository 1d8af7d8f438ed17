"""``torch.ops.rocmflash.*`` work right after ``import rocmflash`` (before any Python API call), in fresh processes.

Each check runs in a child Python: the point is what a fresh process sees, and this test
process has long since imported :mod:`rocmflash.api.ops` through other tests.
"""

import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _python(code: str, interpret: bool = False) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("TRITON_INTERPRET", None)
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=600, env=env, cwd=ROOT)


def _ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.mark.parametrize("imports", ["import torch, rocmflash", "import rocmflash, torch",
                                     "import rocmflash; import torch.nn"])
def test_ops_resolve_after_import_in_either_order(imports):
    out = _ok(_python(f"""
        {imports}
        import sys
        assert "rocmflash.api.ops" not in sys.modules  # nothing heavy until an op is looked up
        print(torch.ops.rocmflash.attn_fwd, torch.ops.rocmflash.attn_bwd)
        assert "rocmflash.api.ops" in sys.modules
    """))
    assert out.split() == ["rocmflash.attn_fwd", "rocmflash.attn_bwd"]


def test_import_rocmflash_stays_cheap_and_unknown_ops_still_raise():
    out = _ok(_python("""
        import sys
        import rocmflash
        assert "torch" not in sys.modules and "triton" not in sys.modules, "import rocmflash pulled in torch"
        import torch
        try:
            torch.ops.rocmflash.no_such_op
        except AttributeError as err:
            print("AttributeError", err)
        assert hasattr(torch.ops.rocmflash, "attn_fwd") and not hasattr(torch.ops.rocmflash, "nope")
        assert "rocmflash" in dir(torch.ops)
    """))
    assert out.startswith("AttributeError") and "no_such_op" in out


def test_namespace_looked_up_before_import_rocmflash():
    """``torch.ops.rocmflash`` touched (and cached by torch) before ``import rocmflash``: the same object works."""
    _ok(_python("""
        import torch
        namespace = torch.ops.rocmflash
        import rocmflash
        assert torch.ops.rocmflash is namespace
        print(namespace.attn_fwd)
    """))


def test_op_called_first_matches_rocmflash_attention_on_cpu():
    out = _ok(_python("""
        import math
        import torch, rocmflash
        from rocmflash.config import KernelConfig
        torch.manual_seed(0)
        q = torch.randn(1, 4, 19, 32, dtype=torch.float16)
        k = torch.randn(1, 2, 23, 32, dtype=torch.float16)
        v = torch.randn(1, 2, 23, 32, dtype=torch.float16)
        cfg = KernelConfig(BLOCK_M=16, BLOCK_N=16)
        out, lse = torch.ops.rocmflash.attn_fwd(q, k, v, True, 1 / math.sqrt(32), "online", cfg.to_json())
        ref = rocmflash.attention(q, k, v, causal=True, config=cfg)
        kr, vr = k.float().repeat_interleave(2, 1), v.float().repeat_interleave(2, 1)
        mask = torch.ones(19, 23, dtype=torch.bool).tril(23 - 19)
        exact = torch.nn.functional.scaled_dot_product_attention(q.float(), kr, vr, attn_mask=mask)
        assert out.shape == (1, 4, 19, 32) and lse.shape == (1, 4, 19) and lse.dtype == torch.float32
        print(float((out.float() - ref.float()).abs().max()), float((out.float() - exact).abs().max()))
    """, interpret=True))
    same_as_api, vs_exact = map(float, out.split())
    assert same_as_api == 0.0
    assert vs_exact < 2e-2


def test_op_packets_carry_torchs_module_name():
    """Inductor finds a custom op again by ``<packet.__module__>.<name>``: it must be torch's namespace module
    (``torch._ops.rocmflash``), also when ``rocmflash.api.ops`` was imported before the first lookup."""
    import subprocess
    import sys

    code = ("import torch, rocmflash, rocmflash.api.ops; p = torch.ops.rocmflash.attn_fwd; "
            "want = torch.ops.aten.add.__module__.replace('aten', 'rocmflash'); "
            "assert p.__module__ == want, (p.__module__, want); "
            "assert type(torch.ops.rocmflash) is type(torch.ops.aten), type(torch.ops.rocmflash); print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
