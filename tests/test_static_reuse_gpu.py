"""GPU test: a live tune launches the binaries its static phase compiled instead of compiling them again.

The static phase cross-compiles every config for the target into
``rocmflash.static.compile.triton_cache_dir``; the live runner's workers launch with Triton's
cache there. Triton keys a build by source, argument specialisation, target and options,
so when the static phase compiles with the launch's specialisation the pre-warm and the
timing worker find every build and compile nothing (but split_kv's, whose split count is
an argument the live shape decides). Checked by counting the code objects in the cache
before and after.
"""

import os

import pytest

from rocmflash.hw.roofline import Shape
from rocmflash.static.compile import sweep, triton_cache_dir
from rocmflash.static.space import default_space
from rocmflash.tuning.live import LiveRunner
from rocmflash.tuning.live_worker import LiveSettings
from rocmflash.tuning.spec import static_problem

pytestmark = [pytest.mark.gpu]
BINARY_SUFFIXES = (".cubin", ".hsaco")


def _binaries(root: str) -> set:
    found = set()
    for folder, _, files in os.walk(root):
        found.update(os.path.join(os.path.basename(folder), f) for f in files if f.endswith(BINARY_SUFFIXES))
    return found


@pytest.mark.parametrize("causal", [False, True])
def test_the_live_runner_finds_every_static_build(live, compiled, tmp_path, causal):
    shape = Shape(batch=2, heads_q=8, heads_kv=2, seqlen_q=2048, seqlen_k=2048, head_dim=64, dtype="fp16",
                  causal=causal)
    problem = static_problem(shape)
    by_variant = {}
    for cfg in default_space(live).configs(problem, live):
        by_variant.setdefault(cfg.variant, []).append(cfg)
    configs = [c for cfgs in by_variant.values() for c in cfgs[:3]]  # three of each variant
    cache = str(tmp_path / "cache")
    observations, stats = sweep(configs, problem, live, cache_dir=cache, workers=4)
    built = [c for c, o in zip(configs, observations) if o["status"] == "ok"]
    assert stats.compiled == len(configs) and len(built) >= 2 * len(by_variant), stats
    before = _binaries(triton_cache_dir(cache))
    assert before, "the static phase left no code objects in Triton's cache"

    with LiveRunner(LiveSettings(timeout_s=120, warmup_ms=2, rep_ms=5, min_reps=3),
                    triton_cache_dir=triton_cache_dir(cache), prewarm_workers=4) as runner:
        errors = runner.prewarm(built, shape)
        assert not any(errors.values()), errors
        after_prewarm = _binaries(triton_cache_dir(cache))
        result = runner.measure(built[0], shape)
    assert result["status"] == "ok", result
    # split_kv passes its split count as a specialised argument: the launch's count comes from the live shape
    # and GPU (at this shape: 1, a constant), the canonical static build's is 2; it is built by the pre-warm
    new = sorted(b for b in after_prewarm - before if "split_kv" not in b)
    assert not new, f"the pre-warm compiled {len(new)} build(s) again: {new}"
    assert _binaries(triton_cache_dir(cache)) == after_prewarm  # the timing worker found them too
