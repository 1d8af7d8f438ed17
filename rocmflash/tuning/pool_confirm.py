"""Torch's word on a ``--gpus`` plan made before torch was imported (issue #29: a cold tune's first seconds).

``rocmflash tune --model ... --gpus`` starts its timing workers before it imports torch
(:func:`~rocmflash.tuning.pool.early_node_pool`). Where the driver's files also name the GPU kind
(:func:`~rocmflash.hw.node_probe.guess_node_gpu`), the plan is made for that kind at once and the static phases
cross-compile while torch imports here, in a thread. The GPUs are identified from their timing workers' reports
(:func:`worker_reports`), so this process opens no device. The pipeline calls the confirmation before it hands out its
first job or writes its first entry (its ``gate``): torch must see the same devices and GPU kind, or the plan is
discarded (:class:`~rocmflash.tuning.pool.DiscardPlan`: nothing was timed or written) and made again.
"""

from __future__ import annotations

import threading


class TorchConfirmation:
    """Imports torch in a thread from construction; calling it waits for torch and checks the guess."""

    def __init__(self, gpus: str, pool, guess, device_name=None):
        self.guess, self.pool, self.device_name = guess, pool, device_name
        self._result = None
        self._error = None
        self._thread = threading.Thread(target=self._run, args=(gpus,), name="rocmflash-torch-import", daemon=True)
        self._thread.start()

    def _run(self, gpus: str) -> None:
        from rocmflash.tuning.output import trace_mark
        from rocmflash.tuning.pool import node_gpu, parse_gpus

        try:
            import torch

            trace_mark("torch_imported")
            from rocmflash.hw.platform import is_rocm

            indices = parse_gpus(gpus, torch.cuda.device_count())  # NVML / amdsmi: no device runtime opened here
            rocm = is_rocm()
            reports = worker_reports(self.pool, indices)
            trace_mark("workers_reported" if reports is not None else "workers_not_reported")
            if reports is None:  # a runner without a report (or a failed one): torch opens the devices here
                gpu = node_gpu(indices)
                names = {torch.cuda.get_device_name(i) for i in indices} if self.device_name is not None else set()
            else:
                gpu = node_gpu(indices, identify=lambda i: _identified(reports[i]))
                names = {r["name"] for r in reports.values()}
                if any(r.get("rocm") != rocm for r in reports.values()):
                    raise RuntimeError("a timing worker's torch is not the tune's build (CUDA against ROCm)")
            self._result = (indices, gpu, rocm, names)
        except BaseException as err:  # told at the confirmation, on the caller's thread
            self._error = err

    def __call__(self) -> None:
        """Return when torch agrees with the guess; else raise :class:`~rocmflash.tuning.pool.DiscardPlan`."""
        from rocmflash.tuning.output import trace_mark
        from rocmflash.tuning.pool import DiscardPlan, early_pool_matches

        trace_mark("gate_called")  # the first job or entry is ready: from here the tune waits for the answer
        self._thread.join()
        trace_mark("gpus_confirmed")
        if self._error is not None:
            raise DiscardPlan(f"torch did not confirm the {self.guess.name} the driver's files name "
                              f"({type(self._error).__name__}: {self._error})") from self._error
        indices, gpu, rocm, names = self._result
        if gpu.name != self.guess.name or not early_pool_matches(self.pool, indices, rocm):
            raise DiscardPlan(f"torch reports {gpu.name} on GPU(s) {', '.join(map(str, indices))}, not the "
                              f"{self.guess.name} the driver's files name")
        if self.device_name is not None and names != {self.device_name}:
            raise DiscardPlan(f"torch names the GPU(s) {', '.join(sorted(names))}, not {self.device_name!r} as the "
                              "driver's files do")


def worker_reports(pool, indices: list, timeout_s: float = 120.0):
    """``{device index: report}`` from the timing workers of ``pool`` that time on ``indices``
    (:meth:`rocmflash.tuning.live.LiveRunner.reported_device`: each worker reports the device it opened, so this
    process needs no device runtime of its own, which costs it seconds beside a full compile pool); None where
    a device has no runner with a report (torch identifies them here instead)."""
    by_index = {getattr(r, "device_index", None): r for r in getattr(pool, "runners", ())}
    reports = {}
    for i in indices:
        runner = by_index.get(i)
        report = runner.reported_device(timeout_s) if hasattr(runner, "reported_device") else None
        if not report:
            return None
        reports[i] = report
    return reports


def _identified(report: dict):
    from rocmflash.hw.detect import identify_device

    return identify_device(**{k: v for k, v in report.items() if k != "rocm"})


__all__ = ["TorchConfirmation", "worker_reports"]
