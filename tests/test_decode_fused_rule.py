"""When a decode launch merges its splits itself (``kv_decode.fuses_merge``): the shipped rule, pure logic.

Small caches on a CUDA GPU fuse (a host-bound step saves its second launch); large caches, ROCm (not yet run on AMD
hardware), the CPU interpreter and a forced flag behave as documented; a captured graph never fuses (checked by
the launch itself, ``tests/test_decode_fused_gpu.py``)."""

import pytest

from rocmflash.kernels.decode import host as KD

SMALL = KD.FUSED_AUTO_MAX_KV_BYTES  # B1, 8k keys, GQA 32:8, D128, bf16: K and V together


def _kv_bytes(batch, keys, kv_heads, head_dim=128, itemsize=2):
    return 2 * batch * keys * kv_heads * head_dim * itemsize


def test_the_threshold_is_b1_over_8k_keys_gqa4_bf16():
    assert _kv_bytes(1, 8192, 8) == SMALL


@pytest.mark.parametrize("batch,keys,kv_heads,itemsize,fused", [
    (1, 2048, 8, 2, True), (1, 8192, 8, 2, True), (1, 16384, 8, 1, True),  # an fp8 cache: half the bytes
    (1, 8192, 8 + 1, 2, False), (1, 32768, 8, 2, False), (8, 8192, 8, 2, False), (1, 8192, 32, 2, False)])
def test_small_caches_fuse_on_cuda(batch, keys, kv_heads, itemsize, fused):
    assert KD.fuses_merge(None, "cuda", True, _kv_bytes(batch, keys, kv_heads, itemsize=itemsize)) is fused


def test_rocm_and_the_cpu_keep_two_launches_unless_forced():
    assert not KD.fuses_merge(None, "hip", True, 1024)  # the merge's memory ordering is unrun on AMD hardware
    assert not KD.fuses_merge(None, "cuda", False, 1024)  # CPU tensors under the interpreter
    assert KD.fuses_merge(True, "hip", True, 10 * SMALL) and KD.fuses_merge(True, "cuda", False, 10 * SMALL)
    assert not KD.fuses_merge(False, "cuda", True, 1024)


@pytest.mark.parametrize("value,forced", [("1", True), ("0", False), (" 1 ", True), ("", None), (None, None),
                                          ("yes", None)])
def test_the_environment_switch(value, forced):
    assert KD.forced_merge(value) is forced
