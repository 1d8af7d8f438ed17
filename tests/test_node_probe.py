"""The node's GPU kind read from the driver's files, without torch (rocmflash.hw.node_probe): a guess that a
``--gpus`` tune plans on while torch imports, so it must rather say nothing than say something wrong."""

import subprocess
import sys

import pytest

from rocmflash.hw import node_probe as NP
from rocmflash.hw.gpus import get_gpu


def _nvidia_proc(tmp_path, names):
    for i, name in enumerate(names):
        d = tmp_path / f"0000:{i:02x}:00.0"
        d.mkdir(parents=True)
        (d / "information").write_text(f"Model: \t\t {name}\nIRQ:             123\nBus Type:        PCIe\n")
    return str(tmp_path)


def _kfd(tmp_path, gpus, cpu_nodes=1):
    """KFD topology nodes: CPU nodes (no SIMDs), then one per ``(gfx_target_version, CUs, VRAM GiB or None)``."""
    for i in range(cpu_nodes):
        (tmp_path / str(i)).mkdir(parents=True)
        (tmp_path / str(i) / "properties").write_text("cpu_cores_count 96\nsimd_count 0\ngfx_target_version 0\n")
    for j, (version, cus, gib) in enumerate(gpus):
        node = tmp_path / str(cpu_nodes + j)
        node.mkdir(parents=True)
        (node / "properties").write_text(f"cpu_cores_count 0\nsimd_count {4 * cus}\nsimd_per_cu 4\n"
                                         f"gfx_target_version {version}\nmax_waves_per_simd 8\n")
        if gib is not None:
            bank = node / "mem_banks" / "0"
            bank.mkdir(parents=True)
            (bank / "properties").write_text(f"heap_type 1\nsize_in_bytes {gib * 2**30}\nwidth 4096\n")
    return str(tmp_path)


def _no_smi(*a, **k):
    raise FileNotFoundError("nvidia-smi")


@pytest.mark.parametrize("version,arch", [(90010, "gfx90a"), (90402, "gfx942"), (90500, "gfx950")])
def test_kfd_target_versions_name_the_catalog_archs(version, arch):
    assert NP.gfx_arch(version) == arch and arch in {g.arch for g in map(get_gpu, ("mi250", "mi300x", "mi355x"))}


def test_nvidia_gpus_named_in_the_driver_proc_files(tmp_path):
    proc = _nvidia_proc(tmp_path / "h100", ["NVIDIA H100 80GB HBM3"] * 2)
    assert NP.guess_node_gpu(False, nvidia=lambda: NP.nvidia_reports(proc, run=_no_smi)) is get_gpu("h100")
    proc = _nvidia_proc(tmp_path / "h200", ["NVIDIA H200"] * 8)
    assert NP.guess_node_gpu(False, nvidia=lambda: NP.nvidia_reports(proc, run=_no_smi)) is get_gpu("h200")


@pytest.mark.parametrize("names", [["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"],  # two kinds
                                   ["NVIDIA GeForce RTX 4090"],  # not in the catalog, and no arch to go by
                                   []])  # no files and no nvidia-smi
def test_no_guess_for_a_mixed_unknown_or_silent_nvidia_node(tmp_path, names):
    proc = _nvidia_proc(tmp_path, names)
    assert NP.guess_node_gpu(False, nvidia=lambda: NP.nvidia_reports(proc, run=_no_smi)) is None


def test_nvidia_smi_answers_when_the_proc_files_are_not_there(tmp_path):
    def smi(argv, **kwargs):
        assert argv[0] == "nvidia-smi" and "--query-gpu=name,compute_cap" in argv
        return subprocess.CompletedProcess(argv, 0, "NVIDIA H100 80GB HBM3, 9.0\nNVIDIA H100 80GB HBM3, 9.0\n", "")

    assert NP.nvidia_reports(str(tmp_path / "none"), run=smi) == [("NVIDIA H100 80GB HBM3", "sm_90")] * 2
    assert NP.guess_node_gpu(False, nvidia=lambda: NP.nvidia_reports(str(tmp_path), run=smi)) is get_gpu("h100")
    failed = lambda argv, **kw: subprocess.CompletedProcess(argv, 9, "", "NVIDIA-SMI has failed")  # noqa: E731
    assert NP.nvidia_reports(str(tmp_path), run=failed) is None
    garbled = lambda argv, **kw: subprocess.CompletedProcess(argv, 0, "NVIDIA H100, [N/A]\n", "")  # noqa: E731
    assert NP.nvidia_reports(str(tmp_path), run=garbled) is None


@pytest.mark.parametrize("name", ["mi300x", "mi325x", "mi250x"])
def test_amd_gpus_told_by_arch_cus_and_memory(tmp_path, name):
    gpu = get_gpu(name)
    version = {"gfx90a": 90010, "gfx942": 90402, "gfx950": 90500}[gpu.arch]
    kfd = _kfd(tmp_path, [(version, gpu.compute_units, int(gpu.memory_gib))] * 8, cpu_nodes=2)
    assert NP.amd_reports(kfd) == [(gpu.arch, gpu.compute_units, int(gpu.memory_gib) * 2**30)] * 8
    assert NP.guess_node_gpu(True, amd=lambda: NP.amd_reports(kfd)) is gpu


@pytest.mark.parametrize("gpus", [
    [(90402, 304, None)],  # no memory bank: an MI300X or an MI325X
    [(90402, 38, None)],  # a CPX partition of either
    [(90500, 256, 288)],  # MI350X and MI355X report alike
    [(90402, 304, 192), (90010, 104, 64)],  # two kinds
    [(110000, 48, 24)],  # an RDNA GPU: not in the catalog
])
def test_no_guess_where_the_amd_files_fit_several_targets_or_none(tmp_path, gpus):
    kfd = _kfd(tmp_path, gpus)
    assert NP.guess_node_gpu(True, amd=lambda: NP.amd_reports(kfd)) is None


def test_unreadable_or_missing_kfd_files_give_no_guess(tmp_path):
    assert NP.amd_reports(str(tmp_path / "absent")) is None
    kfd = _kfd(tmp_path, [(90402, 304, 192)])
    (tmp_path / "1" / "properties").write_text("simd_count 1216\n")  # no version, no SIMDs per CU
    assert NP.amd_reports(kfd) is None


def test_the_probe_never_imports_torch():
    code = ("import sys; from rocmflash.hw import node_probe as NP; NP.guess_node_gpu(False); "
            "NP.guess_node_gpu(True); assert 'torch' not in sys.modules; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_the_device_name_is_the_one_every_nvidia_gpu_reports(tmp_path):
    proc = _nvidia_proc(tmp_path / "one", ["NVIDIA H100 80GB HBM3"] * 4)
    assert NP.nvidia_device_name(lambda: NP.nvidia_reports(proc, run=_no_smi)) == "NVIDIA H100 80GB HBM3"
    proc = _nvidia_proc(tmp_path / "two", ["NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe"])
    assert NP.nvidia_device_name(lambda: NP.nvidia_reports(proc, run=_no_smi)) is None
    assert NP.nvidia_device_name(lambda: None) is None


def test_the_environment_fingerprint_reads_torch_versions_without_importing_torch():
    """A --gpus tune writes its environment while torch imports in a thread: the same fingerprint, no import."""
    import json

    code = ("import json, sys; from rocmflash.db.files import environment; env = environment('dev'); "
            "assert 'torch' not in sys.modules, 'imported torch'; print(json.dumps(env))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    from rocmflash.db.files import environment

    assert json.loads(out.stdout) == environment("dev")  # this process has torch imported: torch.version


def test_the_fingerprint_reads_the_file_while_another_thread_is_importing_torch(monkeypatch):
    """``torch`` sits in sys.modules, half made, while a thread imports it: its file answers, not the module."""
    import types

    from rocmflash.db.files import environment, torch_version_module

    import importlib.util

    half = types.ModuleType("torch")  # what another thread's import has made so far: no torch.version yet
    half.__spec__ = importlib.util.find_spec("torch")  # an import sets the spec before it runs the module
    monkeypatch.setitem(sys.modules, "torch", half)
    version = torch_version_module()
    monkeypatch.undo()
    import torch

    assert version.__version__ == torch.__version__ and version.cuda == torch.version.cuda
    assert environment("dev")["torch"] == torch.__version__
