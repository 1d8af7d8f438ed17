"""Which GPU a Ray timing actor names in its label: the node's id of the device Ray pinned it to.

Ray pins an actor with ``CUDA_VISIBLE_DEVICES`` on NVIDIA and with ``HIP_VISIBLE_DEVICES``
(older releases: ``ROCR_VISIBLE_DEVICES``) on AMD. The actor reads the one its platform
uses (:func:`rocmflash.hw.platform.visible_device_ids`); here under fake ROCm, without Ray.
"""

import socket

import pytest

from rocmflash.hw.platform import visible_device_ids
from rocmflash.tuning.cluster import TimingActor, actor_label


def _label(monkeypatch, tmp_path, **env):
    for var in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    actor = TimingActor(cache_dir=str(tmp_path))
    try:
        info = actor.describe()
    finally:
        actor.close()
    assert info["gpu"] == "mi250"  # the fake's device, seen through the pinned visibility
    return actor_label(info, 7)


@pytest.mark.parametrize("env, device", [
    ({"HIP_VISIBLE_DEVICES": "3"}, "3"),  # what Ray sets on AMD
    ({"ROCR_VISIBLE_DEVICES": "5"}, "5"),  # what older Ray set on AMD
    ({"ROCR_VISIBLE_DEVICES": "4,5", "HIP_VISIBLE_DEVICES": "1"}, "5"),  # HIP indexes into ROCr's list
    ({}, "7"),  # nothing narrowed: the actor's index
])
def test_rocm_actor_label_names_the_pinned_device(fake_rocm, monkeypatch, tmp_path, env, device):
    assert _label(monkeypatch, tmp_path, **env) == f"{socket.gethostname()}:{device}"


def test_visible_device_ids_per_platform():
    env = {"CUDA_VISIBLE_DEVICES": "2", "HIP_VISIBLE_DEVICES": "1"}
    assert visible_device_ids(env, rocm=False) == ["2"]  # CUDA reads only its own variable
    assert visible_device_ids(env, rocm=True) == ["1"]  # HIP's variable wins over its CUDA alias
    assert visible_device_ids({"CUDA_VISIBLE_DEVICES": "0,2"}, rocm=True) == ["0", "2"]  # the alias alone
    assert visible_device_ids({"ROCR_VISIBLE_DEVICES": "GPU-a1,GPU-b2", "HIP_VISIBLE_DEVICES": "1"},
                              rocm=True) == ["GPU-b2"]
    assert visible_device_ids({"ROCR_VISIBLE_DEVICES": "2"}, rocm=False) is None
    assert visible_device_ids({}, rocm=True) is None
