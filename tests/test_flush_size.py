"""The cache flush before each timed run is at least twice the GPU's largest cache, sized in one place.

A flush no larger than the cache leaves part of it warm: MI300X, MI325X and MI355X have a
256 MiB Infinity Cache (the flush was 256 MiB), an H100 a 50 MB L2. Every timing worker
(forward, backward, varlen forward and backward, decode) takes its flush buffer from
:func:`rocmflash.measure.flush_buffer`, sized by :func:`rocmflash.hw.gpus.flush_bytes`.
"""

import types

import pytest
import torch

from rocmflash import measure
from rocmflash.hw import gpus
from rocmflash.hw.roofline import Shape
from rocmflash.tuning import live
from rocmflash.tuning import live_worker as LW

MIB = 1024 * 1024
MI300X = {"name": "AMD Instinct MI300X", "gcn_arch_name": "gfx942:sramecc+:xnack-", "multi_processor_count": 304,
          "total_memory": 192 * 1024**3, "l2_cache_size": 4 * MIB}


@pytest.mark.parametrize("name", ["mi300x", "mi325x", "mi355x", "mi300a", "mi300x-cpx", "mi350x-qpx"])
def test_the_flush_is_twice_the_infinity_cache_on_the_mi300_family(name):
    assert gpus.flush_bytes(gpus.get_gpu(name)) >= 2 * 256 * MIB


@pytest.mark.parametrize("name,l2", [("h100", 50 * MIB), ("h200", 50 * MIB), ("a100", 40 * MIB),
                                     ("mi250", 8 * MIB)])
def test_the_flush_is_at_least_twice_the_l2_and_never_under_the_floor(name, l2):
    size = gpus.flush_bytes(gpus.get_gpu(name))
    assert size >= 2 * l2 and size >= gpus.MIN_FLUSH_BYTES


def test_a_device_off_the_catalog_counts_its_reported_l2_and_on_amd_an_infinity_cache():
    assert gpus.flush_bytes(None, 400 * MIB) == 800 * MIB
    assert gpus.flush_bytes(None, 4 * MIB, amd=True) == 512 * MIB
    assert gpus.flush_bytes(None, 4 * MIB) == gpus.MIN_FLUSH_BYTES
    with pytest.raises(TypeError, match="catalog GPU"):
        gpus.flush_bytes("mi300x")
    with pytest.raises(ValueError, match="l2_bytes"):
        gpus.flush_bytes(None, -1)


@pytest.mark.parametrize("fake_rocm", [MI300X], indirect=True)
def test_a_live_mi300x_gets_twice_its_infinity_cache(fake_rocm):
    assert measure.device_flush_bytes(torch.device("cuda")) == 512 * MIB


def test_a_live_h100_gets_at_least_twice_its_l2(monkeypatch):
    props = types.SimpleNamespace(name="NVIDIA H100 80GB HBM3", major=9, minor=0, multi_processor_count=132,
                                  warp_size=32, L2_cache_size=50 * MIB)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index=None: props)
    assert measure.device_flush_bytes(torch.device("cuda", 0)) >= 100 * MIB
    props.L2_cache_size = 300 * MIB  # what the runtime reports counts too
    assert measure.device_flush_bytes(torch.device("cuda", 0)) == 600 * MIB


def test_flush_buffer_sizes_a_gpu_s_flush_and_none_off_a_gpu(monkeypatch):
    made = []
    monkeypatch.setattr(measure, "device_flush_bytes", lambda dev: 3 * 256 * MIB)
    monkeypatch.setattr(torch, "empty", lambda n, device, dtype: made.append((n, device, dtype)) or "buffer")
    assert measure.flush_buffer(torch.device("cuda")) == "buffer"
    assert made == [(3 * 64 * MIB, torch.device("cuda"), torch.int32)]
    assert measure.flush_buffer(torch.device("cpu")) is None and len(made) == 1


@pytest.fixture
def flushes(monkeypatch):
    """Every flush_buffer call: ``[(device, nbytes), ...]`` (the buffer itself: None, as on a CPU)."""
    calls = []
    monkeypatch.setattr(measure, "flush_buffer", lambda dev, nbytes=None: calls.append((dev, nbytes)))
    return calls


CPU = torch.device("cpu")


def test_the_forward_worker_takes_its_flush_from_flush_buffer(flushes):
    shape = Shape(batch=1, heads_q=2, heads_kv=1, seqlen_q=16, seqlen_k=16, head_dim=16)
    LW._STATE.clear()
    try:
        LW._inputs(shape, live.LiveSettings(n_inputs=1), CPU)
    finally:
        LW._STATE.clear()
    assert flushes == [(CPU, None)] and live.LiveSettings().flush_bytes is None  # None: sized for the device


def test_the_decode_worker_takes_its_flush_and_its_cold_copies_from_the_one_size(flushes, monkeypatch):
    from rocmflash.tuning import decode

    decode._INPUTS.clear()
    try:
        inp = decode._decode_inputs(decode.DecodeProblem(head_dim=16, heads_q=2, heads_kv=1, batch=1,
                                                         seqlen_k=32).validate(), CPU)
        per_copy = 2 * inp["k"].numel() * inp["k"].element_size()
        monkeypatch.setattr(measure, "device_flush_bytes", lambda dev: 5 * per_copy - 1)
        assert len(decode._cold_copies(inp)) == 5
    finally:
        decode._INPUTS.clear()
    assert flushes == [(CPU, None)]


def test_the_varlen_forward_worker_takes_its_flush_from_flush_buffer(flushes):
    from rocmflash.tuning import varlen_worker
    from rocmflash.tuning.varlen import VarlenProblem

    varlen_worker._INPUTS.clear()
    try:
        varlen_worker.packed_inputs(VarlenProblem(head_dim=16, heads_q=2, heads_kv=1, lengths=(16, 32)), CPU)
    finally:
        varlen_worker._INPUTS.clear()
    assert flushes == [(CPU, None)]


def test_the_backward_workers_take_their_flush_from_flush_buffer(flushes, interpret):
    from rocmflash.tuning import backward, varlen_bwd_worker
    from rocmflash.tuning.varlen import VarlenProblem

    backward._INPUTS.clear()
    varlen_bwd_worker._INPUTS.clear()
    try:
        backward._bwd_inputs(Shape(batch=1, heads_q=2, heads_kv=1, seqlen_q=16, seqlen_k=16, head_dim=16), CPU)
        varlen_bwd_worker.backward_inputs(VarlenProblem(head_dim=16, heads_q=2, heads_kv=1, lengths=(16,)), CPU)
    finally:
        backward._INPUTS.clear()
        varlen_bwd_worker._INPUTS.clear()
    assert flushes == [(CPU, None), (CPU, None)]
