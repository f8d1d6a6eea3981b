"""The prediction (``dlbooster predict``): compute plus exposed communication in
DistributedDataParallel's gradient buckets, decode and host work per iteration, and the
stage that bounds it (:func:`predict`)."""

from __future__ import annotations

import math

from dlbooster.predict.work import Workload
from dlbooster.predict.profiles import Profile, op_time

__all__ = ["parse_decoder", "SPLIT_CPU_OVERHEAD", "FIRST_BUCKET", "BUCKET", "buckets", "predict"]


def parse_decoder(text: str | None) -> dict | None:
    """``LANESxMHZ`` (FPGA decoder lanes per node and their clock) or ``cpu:CORES``.

    Raises:
        ValueError: neither form, or a count or clock not above 0.
    """
    if text is None:
        return None
    form = f"--decoder is LANESxMHZ (e.g. 8x250) or cpu:CORES (e.g. cpu:16), not {text!r}"
    try:
        if text.startswith("cpu:"):
            decoder = {"kind": "cpu", "cores": int(text[4:])}
            ok = decoder["cores"] >= 1
        else:
            lanes, sep, mhz = text.lower().partition("x")
            decoder = {"kind": "fpga", "lanes": int(lanes), "mhz": float(mhz)}
            ok = bool(sep) and decoder["lanes"] >= 1 and 0 < decoder["mhz"] < math.inf
        # A count beyond a float overflowed in the rate's arithmetic (a traceback).
        ok = ok and math.isfinite(float(decoder.get("lanes", 1))) and math.isfinite(float(decoder.get("cores", 1)))
    except (TypeError, ValueError, OverflowError):
        raise ValueError(form) from None
    if not ok:
        raise ValueError(f"{form}: lanes, MHz and cores must be above 0")
    return decoder


# --------------------------------------------------------------------------- prediction

#: ``--backward split``'s measured cost on the CPU, a share of the compute stage
#: (docs/benchmarks.md); reported as the breakdown's ``split_overhead``.
SPLIT_CPU_OVERHEAD = 0.012

#: DistributedDataParallel's bucket sizes (torch.distributed defaults).
FIRST_BUCKET = 1 << 20
BUCKET = 25 << 20


def buckets(work: Workload, ready: dict) -> list:
    """Gradient buckets as DDP forms them after its first iteration (parameters in the
    order their gradients became ready): ``[(ready_time, bytes)]``."""
    order = sorted(ready, key=ready.get)
    out, size, cap, last = [], 0, FIRST_BUCKET, 0.0
    for index in order:
        size += work.param_bytes[index]
        last = max(last, ready[index])
        if size >= cap:
            out.append((last, size))
            size, cap = 0, BUCKET
    if size:
        out.append((last, size))
    return out


def predict(work: Workload, profile: Profile, *, gpus: int = 1, nodes: int = 1,
            network_gbps: float | None = None, decoder: dict | None = None,
            backward: str = "autograd", image_pixels: float | None = None) -> dict:
    """Predicted iteration time of ``work`` on ``gpus`` devices per node x ``nodes``.

    Args:
        work: :func:`workload` at the per-device batch size.
        profile: the device's :class:`Profile` (for a CPU, one measured with
            ``procs == gpus``: ranks share the machine).
        gpus, nodes: data-parallel ranks per node, nodes.
        network_gbps: inter-node bandwidth, Gbit/s (needed when ``nodes > 1``).
        decoder: :func:`parse_decoder`'s result: the node's input pipeline.
        backward: ``autograd`` or ``split``.
        image_pixels: decoded pixels per image (default: the ImageNet samples' mean).

    Returns:
        ``{"iteration_s", "images_per_s", "bottleneck", "stages": {...}, "breakdown": {...}}``
        (seconds; ``images_per_s`` over all ranks; every number finite). The compute
        stage is the breakdown's forward, input_gradient, weight_gradient,
        backward_other, optimizer, allreduce_exposed and split_overhead added up.

    Raises:
        TypeError: ``profile`` is not a :class:`Profile`.
        ValueError: ``gpus`` or ``nodes`` not a whole number above 0, ``network_gbps``
            not above 0; several nodes without ``network_gbps``; unknown ``backward``; a
            CPU profile measured with another number of processes than ``gpus``; several
            devices on one node with a profile that has no all-reduce (a calibrated GPU);
            a time that overflows a float (a profile or network at the edge of its
            bounds, a huge batch).
    """
    from dlbooster.hw.build.synth import IMAGENET_CLOCKS, IMAGENET_PIXELS

    if not isinstance(profile, Profile):
        raise TypeError(f"profile must be a Profile (load_profile(name)), not {type(profile).__name__}")
    for name, value in (("gpus", gpus), ("nodes", nodes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a whole number above 0, not {value!r}")
    if network_gbps is not None and not 0 < network_gbps < math.inf:
        raise ValueError(f"network_gbps must be a finite number above 0, not {network_gbps!r}")
    if backward not in ("autograd", "split"):
        raise ValueError(f"backward must be autograd or split, not {backward!r}")
    if nodes > 1 and not network_gbps:
        raise ValueError("several nodes need --network GBPS")
    if profile.kind == "cpu" and profile.procs != gpus:
        raise ValueError(f"CPU profile {profile.name!r} was measured with {profile.procs} process(es), "
                         f"not {gpus}: ranks share the machine; run `dlbooster predict calibrate --procs {gpus}`")
    if gpus > 1 and nodes == 1 and math.isinf(profile.allreduce[1]):
        raise ValueError(f"profile {profile.name!r} has no all-reduce measurement: predict one device with it, "
                         f"or use a profile that has one")
    times = {"forward": 0.0, "input_gradient": 0.0, "weight_gradient": 0.0, "backward_other": 0.0,
             "optimizer": 0.0}
    clock = 0.0
    ready: dict[int, float] = {}
    for op in work.ops:
        t = op_time(profile, op)
        clock += t if op.phase != "optimizer" else 0.0
        if op.phase == "forward":
            times["forward"] += t
        elif op.phase == "optimizer":
            times["optimizer"] += t
        else:
            key = {"dgrad": "input_gradient", "wgrad": "weight_gradient"}.get(op.kind, "backward_other")
            times[key] += t
        for index in op.grads:
            ready[index] = clock
    backward_end = clock
    ranks = gpus * nodes
    comm_total = exposed = 0.0
    if ranks > 1:
        latency, rate = profile.allreduce
        if nodes > 1:
            rate = min(rate, network_gbps * 1e9 / 8)
        end = 0.0
        under_compute = 0.0
        for when, size in buckets(work, ready):
            duration = 2 * (ranks - 1) * latency + 2 * (ranks - 1) / ranks * size / rate
            start = max(when, end)
            end = start + duration
            comm_total += duration
            under_compute += max(0.0, min(end, backward_end) - start)
        # Communication under backward compute is hidden to the profile's overlap; what
        # runs after the backward is exposed in full.
        exposed = max(0.0, end - backward_end) + (1 - profile.overlap) * under_compute
    compute = backward_end + exposed + times["optimizer"]
    split_overhead = 0.0
    if backward == "split" and profile.kind == "cpu":
        # Measured cost of the split schedule on the CPU (docs/benchmarks.md).
        split_overhead = SPLIT_CPU_OVERHEAD * compute
        compute += split_overhead
    per_node = work.batch_size * gpus
    stages = {"compute": compute}
    if decoder:
        pixels = image_pixels or IMAGENET_PIXELS
        if decoder["kind"] == "fpga":
            rate = decoder["lanes"] * decoder["mhz"] * 1e6 / (IMAGENET_CLOCKS * pixels / IMAGENET_PIXELS)
        else:
            rate = decoder["cores"] * profile.decode_per_core * IMAGENET_PIXELS / pixels
        stages["decode"] = per_node / rate
        # The runtime's host work runs on one core per rank beside the device.
        stages["host"] = work.batch_size * profile.host_us_per_image * 1e-6
    bottleneck = max(stages, key=stages.get)
    iteration = stages[bottleneck]
    if not 0 < iteration < math.inf or not all(math.isfinite(t) for t in (*times.values(), comm_total)):
        # Only a profile's or a network's figures at the edge of their bounds get here.
        raise ValueError(f"profile {profile.name!r} prices {work.model} at batch {work.batch_size} and "
                         f"{work.image_size}x{work.image_size} beyond a floating-point number "
                         f"(iteration {iteration!r} s); check the profile's figures")
    if bottleneck == "compute" and exposed > 0.5 * compute:
        bottleneck = "communication"
    return {
        "model": work.model, "batch_size": work.batch_size, "image_size": work.image_size,
        "gpus": gpus, "nodes": nodes, "device": profile.name, "device_source": profile.source,
        "backward": backward, "iteration_s": iteration, "images_per_s": work.batch_size * ranks / iteration,
        "bottleneck": bottleneck, "stages": stages,
        "breakdown": {**times, "allreduce": comm_total, "allreduce_exposed": exposed, "split_overhead": split_overhead,
                      "gradient_bytes": work.gradient_bytes, "forward_gflop": work.flops("forward") / 1e9,
                      "fresh_bytes": work.fresh_bytes, "page_faults": work.fresh_bytes * profile.fault,
                      "backward_gflop": work.flops("backward") / 1e9},
    }
