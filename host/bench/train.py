"""``dlbooster bench backward``: training iteration time, autograd versus split backward.

One iteration is forward, loss, backward and an SGD step of a torchvision model on a
fixed batch (random inputs drawn once: the benchmark times the model, not the data).
For each batch size and dtype the two schedules alternate (which goes first alternates
too), ``iterations`` timed iterations each per round (after ``warmup`` untimed ones), so that both see the same
machine state; reported are the medians over rounds and the median of the per-round
ratios (robust to a busy neighbour slowing a few rounds). On CUDA the
clock is read after ``torch.cuda.synchronize()``; ``bf16`` runs the forward pass under
``torch.autocast`` (weights stay float32).
"""

from __future__ import annotations

import copy
import statistics
import time

__all__ = ["bench_backward"]


def _iteration_time(model, x, y, optimizer, iterations: int, device, dtype) -> float:
    import torch
    import torch.nn.functional as F

    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    for _ in range(iterations):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == "bf16"):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    sync()
    return (time.perf_counter() - start) / iterations


def bench_backward(*, model: str = "resnet18", batch_sizes=(32,), dtypes=("fp32",), image_size: int = 224,
                   device: str = "cpu", iterations: int = 1, rounds: int = 15, warmup: int = 1,
                   streams: int = 2) -> dict:
    """Seconds per iteration with autograd and with :class:`~dlbooster.train.schedule.SplitBackward`.

    Returns:
        ``{"model", "device", "configs": [{"batch_size", "dtype", "autograd_s",
        "split_s", "split_over_autograd", "rounds": [...]}, ...]}``; seconds are medians
        over rounds of the mean iteration time, ``split_over_autograd`` the median of
        the per-round ratios.
    """
    import torch
    import torchvision

    from dlbooster.train.schedule import SplitBackward

    if iterations < 1 or rounds < 1 or warmup < 0:
        raise ValueError("iterations and rounds must be at least 1, warmup at least 0")
    dev = torch.device(device)
    configs = []
    for batch in batch_sizes:
        for dtype in dtypes:
            torch.manual_seed(0)
            base = torchvision.models.get_model(model, num_classes=1000).to(dev, memory_format=torch.channels_last)
            plain, split = base, copy.deepcopy(base)
            scheduler = SplitBackward(split, streams=streams)
            x = torch.randn(batch, 3, image_size, image_size, device=dev).contiguous(memory_format=torch.channels_last)
            y = torch.randint(0, 1000, (batch,), device=dev)
            runs = {}
            for name, m in (("autograd", plain), ("split", split)):
                opt = torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9)
                runs[name] = (m, opt)
                if warmup:
                    _iteration_time(m, x, y, opt, warmup, dev, dtype)
            per_round = []
            for k in range(rounds):
                row = {}
                order = list(runs.items())
                for name, (m, opt) in order if k % 2 == 0 else order[::-1]:   # neither always first
                    row[name] = _iteration_time(m, x, y, opt, iterations, dev, dtype)
                per_round.append(row)
            scheduler.remove()
            a = statistics.median(r["autograd"] for r in per_round)
            s = statistics.median(r["split"] for r in per_round)
            ratio = statistics.median(r["split"] / r["autograd"] for r in per_round)
            configs.append({"batch_size": batch, "dtype": dtype, "autograd_s": a, "split_s": s,
                            "split_over_autograd": ratio, "rounds": per_round})
            del plain, split, runs
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    return {"kind": "backward", "model": model, "device": str(dev), "image_size": image_size,
            "iterations": iterations, "rounds": rounds, "warmup": warmup, "streams": streams,
            "torch": torch.__version__, "intra_op_threads": torch.get_num_threads(),
            "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None, "configs": configs}
