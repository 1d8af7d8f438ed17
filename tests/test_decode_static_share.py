"""The decode buckets of a model share one static phase (#29): a decode build depends on the batch and the cached
length only through storage past the 2 GiB line, so every bucket under it compiles the same binaries -- checked
here against real gfx942 / gfx950 builds, not assumed -- and a tune compiles them once."""

from __future__ import annotations

import pytest

from rocmflash.hw.gpus import get_gpu
from rocmflash.static.compile import sweep_family
from rocmflash.tuning.decode import DecodeProblem, decode_space, static_phase
from rocmflash.tuning.items_decode import DecodeItem

SMALL = dict(head_dim=64, dtype="bf16", heads_q=8, heads_kv=2)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("decode-static-share"))


@pytest.mark.parametrize("gpu_name", ["mi300x", "mi355x"])
def test_decode_buckets_under_the_2gib_line_build_the_same_binaries(tmp_path, gpu_name):
    """The premise of sharing: two buckets' own problems (not the shared one) give byte-identical code objects."""
    gpu = get_gpu(gpu_name)
    config = decode_space(gpu.arch)[0]
    hashes = []
    for batch, seqlen_k in ((32, 1024), (3, 8200)):
        problem = DecodeProblem(batch=batch, seqlen_k=seqlen_k, **SMALL).validate()
        (obs,), _ = sweep_family("decode", [config], problem.to_dict(), gpu, str(tmp_path), 1)
        assert obs["status"] == "ok", obs.get("error")
        hashes.append(obs["binary_sha256"])
    assert hashes[0] == hashes[1]


def test_the_second_bucket_of_a_model_compiles_nothing(cache_dir):
    gpu = get_gpu("mi300x")
    configs = decode_space(gpu.arch)[:2]
    first = static_phase(gpu, DecodeProblem(batch=32, seqlen_k=2048, **SMALL).validate(), cache_dir, 2,
                         configs=configs)
    assert first.stats.compiled == len(configs)
    second = static_phase(gpu, DecodeProblem(batch=32, seqlen_k=8192, **SMALL).validate(), cache_dir, 2,
                          configs=configs)
    assert (second.stats.compiled, second.stats.cache_hits) == (0, len(configs))
    assert [r["kept"] for r in second.rows] == [r["kept"] for r in first.rows]
    assert second.problem.seqlen_k == 8192  # the static result still names its own problem


def test_decode_items_share_a_static_group_only_under_the_2gib_line():
    def item(batch, seqlen_k, **kw):
        return DecodeItem(None, DecodeProblem(batch=batch, seqlen_k=seqlen_k, **kw).validate())

    small = [item(32, 1024), item(32, 8192), item(1, 4096)]
    assert len({i.static_group for i in small}) == 1
    assert small[0].compile_problem() == DecodeProblem(batch=1, seqlen_k=4096).to_dict()
    # 32 x 32768 x 8 x 128 x 2 bytes per cache: past the line, so its own sizes build (global loads on AMD)
    big = item(32, 32768)
    assert big.compile_problem() == big.problem.to_dict()
    assert big.static_group != small[0].static_group
    # what is not a size still tells the builds apart
    assert item(32, 2048, page_size=16).static_group != small[0].static_group
    assert item(32, 2048, head_dim=64).static_group != small[0].static_group
