"""GPU: a timing worker's warm-up runs every step on the device (seconds, no error)."""

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("compiled")]


def test_warm_device_runs_every_step():
    from rocmflash.tuning.worker_warm import STEPS, warm_device

    done = warm_device()
    assert list(done) == [name for name, _ in STEPS]
    assert all(isinstance(seconds, float) for seconds in done.values()), done
