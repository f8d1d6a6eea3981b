"""``dlbooster predict validate``: the predictor against measured iteration times.

A measured iteration is what :func:`dlbooster.predict.work.workload` records: forward,
cross-entropy, backward and an SGD step (momentum 0.9, weight decay 1e-4) of a randomly
initialised torchvision model on a fixed random batch. By default one process uses every
core and ``procs`` processes (gloo, ``DistributedDataParallel``, as ``torchrun`` would
start them on this machine) use ``cores / procs`` threads each; :func:`validate` measures
with the thread count each profile was calibrated with, so that both sides of the
comparison ran the same way. Reported per
configuration: the median of ``iterations`` timed iterations after ``warmup`` untimed
ones (rank 0's clock; DDP's all-reduce keeps the ranks in step), the prediction from the
calibrated profile for that process count, and the absolute percentage error.
"""

from __future__ import annotations

import os
import statistics

from dlbooster.predict.calibration import run_ranks, time_steps
from dlbooster.predict.model import predict
from dlbooster.predict.profiles import load_profile
from dlbooster.predict.work import REFERENCE_MODELS, build_model, workload

__all__ = ["measure_iteration", "validate"]


def _worker(rank, procs, port, queue, threads, model, batch_size, image_size, iterations, warmup):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(threads)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=procs)
    try:
        torch.manual_seed(0)
        net = DistributedDataParallel(build_model(model))
        times = time_steps(net, batch_size, image_size, iterations, warmup)
        if rank == 0:
            queue.put(times)
    finally:
        dist.destroy_process_group()


def measure_iteration(model: str, batch_size: int, *, image_size: int = 128, procs: int = 1,
                      threads: int | None = None, iterations: int = 5, warmup: int = 2,
                      device: str = "cpu") -> float:
    """Median seconds of one training iteration (see the module docstring), with
    ``threads`` intra-op threads per process (default: cores / procs); ``device``
    ``cuda``: one process training on the current GPU (fp32).

    Raises:
        ValueError: several processes on a GPU.
    """
    import torch

    threads = threads or max(1, (os.cpu_count() or 1) // procs)
    if procs == 1:
        torch.set_num_threads(threads)
        torch.manual_seed(0)
        return statistics.median(time_steps(build_model(model), batch_size, image_size,
                                             iterations, warmup, device))
    if device != "cpu":
        raise ValueError("GPU iterations are measured with one process")
    return statistics.median(run_ranks(_worker, procs, threads, model, batch_size, image_size,
                                       iterations, warmup))


def validate(models, batch_sizes, *, procs=(1, 2), image_size: int = 128, iterations: int = 5,
             warmup: int = 2, rounds: int = 1, progress=None, device: str = "cpu") -> dict:
    """Measured against predicted iteration time for every model x batch size x process
    count, with the calibrated ``cpu-p{procs}`` profiles; or, with ``device`` naming a
    GPU profile (``cuda``, the calibrated one; a shipped one such as ``h100``; a JSON
    file), one process training on the current GPU against that profile.

    With ``rounds`` > 1 every configuration is measured once per round, the rounds one
    after another over all configurations, so that a slow spell of the machine touches
    one measurement of many configurations rather than all of one; the measured time is
    the median of the rounds' medians.

    Returns:
        ``{"rows": [{"model", "batch_size", "procs", "measured_s", "rounds_s",
        "predicted_s", "error_pct"}, ...], "mean_error_pct", "worst_error_pct",
        "profiles": {...}, "step_factors": {...}, "reference_models"}``
        (``reference_models``: validated models that also set the profiles'
        ``step_factor``, :data:`dlbooster.predict.work.REFERENCE_MODELS`; their rows are not
        held out).

    Raises:
        FileNotFoundError: a profile is missing (``dlbooster predict calibrate --procs N``).
    """
    gpu = device != "cpu"
    if gpu:
        procs = (1,)
    profiles = {p: load_profile(device, procs=p) for p in procs}
    rows = []
    for model in models:
        for batch in batch_sizes:
            work = workload(model, batch, image_size=image_size)
            for p in procs:
                rows.append({"model": model, "batch_size": batch, "procs": p, "rounds_s": [],
                             "predicted_s": predict(work, profiles[p], gpus=p)["iteration_s"]})
    for _ in range(rounds):
        for row in rows:
            row["rounds_s"].append(measure_iteration(row["model"], row["batch_size"], image_size=image_size,
                                                     procs=row["procs"], threads=profiles[row["procs"]].threads,
                                                     iterations=iterations, warmup=warmup,
                                                     device="cuda" if gpu else "cpu"))
            row["measured_s"] = statistics.median(row["rounds_s"])
            row["error_pct"] = 100 * abs(row["predicted_s"] - row["measured_s"]) / row["measured_s"]
            if progress:
                progress(row)
    errors = [r["error_pct"] for r in rows]
    return {"image_size": image_size, "rounds": rounds, "iterations": iterations, "rows": rows,
            "mean_error_pct": statistics.mean(errors), "worst_error_pct": max(errors),
            "profiles": {p: profiles[p].source for p in procs},
            "step_factors": {p: profiles[p].step_factor for p in procs},
            "reference_models": sorted(set(models) & set(REFERENCE_MODELS)), "device": device}
