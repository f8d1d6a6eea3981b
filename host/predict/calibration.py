"""Calibration (``dlbooster predict calibrate``): a profile measured on the machine at hand by
timing representative kernels, memory-bound operators, page faults and all-reduces
between local processes, and the reference models' step factor (:func:`calibrate`)."""

from __future__ import annotations

import datetime
import io
import math
import os
import platform
import queue as queues
import socket
import statistics
import time
from dataclasses import replace

import numpy as np

from dlbooster.backends import decode
from dlbooster.predict.model import predict
from dlbooster.predict.profiles import HOST_US_PER_IMAGE, Profile, kernel_time
from dlbooster.predict.work import REFERENCE_MODELS, build_model, record_op, workload

__all__ = ["time_steps", "step_factor", "fit_dims", "calibrate_kernels", "run_ranks", "calibrate"]


def time_steps(net, batch_size: int, image_size: int, iterations: int, warmup: int,
               device: str = "cpu") -> list[float]:
    """Seconds of each of ``iterations`` training steps of ``net`` after ``warmup`` untimed
    ones: forward, cross-entropy, backward and an SGD step (momentum 0.9, weight decay
    1e-4, as :func:`workload` records) on a fixed random batch; on a GPU the clock is read
    after the queued work finishes."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    net = net.to(device)
    x = torch.randn(batch_size, 3, image_size, image_size, device=device)
    y = torch.randint(0, 1000, (batch_size,), device=device)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    wait = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    times = []
    for step in range(warmup + iterations):
        wait()
        start = time.perf_counter()
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        wait()
        if step >= warmup:
            times.append(time.perf_counter() - start)
    return times


def _reference_steps(device: str, sync, parallel: bool = False) -> dict:
    """``{model: [batch size, image side, median step seconds]}`` of the reference models,
    trained in this process (``sync`` lines the ranks up first). ``parallel``: this is
    one of several ranks of a process group, and the model is wrapped in
    ``DistributedDataParallel``, whose gradient all-reduce keeps the ranks in step, so
    that their kernels meet in the caches and memory as data-parallel training's do."""
    import torch

    steps = {}
    for name, (batch, side) in REFERENCE_MODELS.items():
        torch.manual_seed(0)
        net = build_model(name)
        if parallel:
            from torch.nn.parallel import DistributedDataParallel

            net = DistributedDataParallel(net)
        sync()
        steps[name] = [batch, side, statistics.median(time_steps(net, batch, side, 5, 2, device=device))]
        del net
    return steps


def step_factor(profile: Profile, steps: dict) -> float:
    """Geometric mean over the reference models of their measured step over the sum of
    their operators' prices on ``profile`` (factor 1, no page faults: the calibration
    trains them with freed memory kept), the modelled all-reduce time taken off the
    measured step first for a profile of several processes; 1 without ``steps``."""
    if not steps:
        return 1.0

    plain = replace(profile, step_factor=1.0, fault=0.0)
    logs = []
    for name, (batch, side, seconds) in steps.items():
        work = workload(name, int(batch), image_size=int(side), foreach=profile.kind == "gpu")
        priced = sum(kernel_time(plain, op) for op in work.ops)
        comm = predict(work, plain, gpus=profile.procs)["iteration_s"] - priced if profile.procs > 1 else 0.0
        logs.append(math.log(max(seconds - comm, 1e-3 * priced) / priced))
    return math.exp(sum(logs) / len(logs))


def _timed(fn, *, min_seconds: float = 0.01, reps: int = 3, wait=None) -> float:
    """Median seconds of ``fn()`` after one warm-up call, over ``reps`` samples of at
    least ``min_seconds`` each (short kernels are looped). ``wait``: called before each
    clock read to finish queued work (``torch.cuda.synchronize`` for a GPU)."""
    wait = wait or (lambda: None)
    fn()
    wait()
    start = time.perf_counter()
    fn()
    wait()
    once = max(time.perf_counter() - start, 1e-7)
    loops = max(1, int(min_seconds / once))
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        for _ in range(loops):
            fn()
        wait()
        samples.append((time.perf_counter() - start) / loops)
    samples.sort()
    return samples[len(samples) // 2]


def _conv_shapes(cls: str, rng, count: int, max_flops: float) -> list:
    """A seeded grid of convolution shapes of class ``cls``: (N, Cin, H, Cout, k, stride, groups)."""
    channels = [16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 512]
    sizes = [7, 14, 28, 56, 112]
    shapes = []
    while len(shapes) < count:
        n = int(rng.choice([1, 2, 4, 8, 16, 32]))
        h = int(rng.choice(sizes))
        cin, cout = int(rng.choice(channels)), int(rng.choice(channels))
        stride = int(rng.choice([1, 1, 1, 2]))
        groups = 1
        if cls == "k1":
            k = 1
        elif cls == "k3":
            k = 3
        elif cls == "kn":
            k = int(rng.choice([5, 7, 11]))
            if rng.random() < 0.3:
                cin = 3                 # a stem convolution on the image
            h = int(rng.choice([28, 56, 112, 224]))
        elif cls == "dw":
            k = int(rng.choice([3, 5]))
            cout = groups = cin
        else:
            k = int(rng.choice([1, 3]))
            groups = int(rng.choice([2, 4, 8]))
            cin, cout = cin - cin % groups, cout - cout % groups
        ho = (h + 2 * (k // 2) - k) // stride + 1
        flops = 2.0 * n * cout * ho * ho * (cin // groups) * k * k
        if 1e5 <= flops <= max_flops:
            shapes.append((n, cin, h, cout, k, stride, groups))
    return shapes


def fit_dims(samples: list) -> dict:
    """Least squares of ``log t`` on ``1, log M, log N, log K, log bytes`` over
    ``((M, N, K), bytes, t)`` samples, and the highest rate measured (``peak``,
    ``2 M N K / t`` flops/s)."""
    a = np.array([[1.0, *(math.log(v) for v in dims), math.log(b)] for dims, b, _ in samples])
    y = np.array([math.log(t) for _, _, t in samples])
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    peak = max(2.0 * math.prod(dims) / t for dims, _, t in samples)
    return {"dims": [float(c) for c in coef], "peak": peak}


def _fit_linear(samples: list) -> list:
    """``t = t0 + bytes / bw`` over (bytes, t), weighted for relative error; t0, bw >= 0."""
    b = np.array([s[0] for s in samples], dtype=float)
    t = np.array([s[1] for s in samples], dtype=float)
    w = 1.0 / t
    a = np.stack([w, b * w], axis=1)
    (t0, inv_bw), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    if inv_bw <= 0:
        inv_bw = float(np.median(t / b))
    return [max(float(t0), 0.0), 1.0 / float(inv_bw)]


def _memory_kernels(torch):
    """(operator name, builder(elements) -> (fn, recorded op name)) for the memory-bound
    operators CNN training runs; each fn is one call of that operator."""
    aten = torch.ops.aten
    F = torch.nn.functional

    def t(n):
        """About n elements as (N, 64, H, H): H up to 56, then more images."""
        h = min(56, max(1, int(math.sqrt(n / 64))))
        return torch.randn(max(1, n // (64 * h * h)), 64, h, h)

    def bn(n):
        x = t(n)
        c = x.shape[1]
        rm, rv, w, b = torch.zeros(c), torch.ones(c), torch.ones(c), torch.zeros(c)
        return x, rm, rv, w, b

    def bn_bwd(n):
        x, rm, rv, w, b = bn(n)
        out, mean, invstd = aten.native_batch_norm(x, w, b, rm, rv, True, 0.1, 1e-5)
        g = torch.randn_like(x)
        return lambda: aten.native_batch_norm_backward(g, x, w, rm, rv, mean, invstd, True, 1e-5,
                                                       [True, True, True])

    def pool_bwd(n):
        x = t(n)
        out, idx = aten.max_pool2d_with_indices(x, [3, 3], [2, 2], [1, 1])
        g = torch.randn_like(out)
        return lambda: aten.max_pool2d_with_indices_backward(g, x, [3, 3], [2, 2], [1, 1], [1, 1], False, idx)

    def two(n):
        return t(n), t(n)

    return {
        "relu_": lambda n: (lambda x=t(n): torch.relu_(x)),
        "threshold_backward": lambda n: (lambda g=t(n), x=t(n): aten.threshold_backward(g, x, 0)),
        "add": lambda n: (lambda xy=two(n): xy[0] + xy[1]),
        "add_": lambda n: (lambda xy=two(n): xy[0].add_(xy[1], alpha=0.5)),
        "mul_": lambda n: (lambda x=t(n): x.mul_(0.999)),
        "mul": lambda n: (lambda xy=two(n): xy[0] * xy[1]),
        "clone": lambda n: (lambda x=t(n): x.clone()),
        "cat": lambda n: (lambda xy=two(n): torch.cat(xy, 1)),
        "hardtanh_": lambda n: (lambda x=t(n): F.hardtanh_(x, 0.0, 6.0)),
        "hardtanh_backward": lambda n: (lambda g=t(n), x=t(n): aten.hardtanh_backward(g, x, 0.0, 6.0)),
        "native_batch_norm": lambda n: (lambda a=bn(n): aten.native_batch_norm(a[0], a[3], a[4], a[1], a[2],
                                                                               True, 0.1, 1e-5)),
        "native_batch_norm_backward": bn_bwd,
        "max_pool2d_with_indices": lambda n: (lambda x=t(n): aten.max_pool2d_with_indices(x, [3, 3], [2, 2], [1, 1])),
        "max_pool2d_with_indices_backward": pool_bwd,
        "avg_pool2d": lambda n: (lambda x=t(n): aten.avg_pool2d(x, [2, 2], [2, 2])),
        "mean": lambda n: (lambda x=t(n): x.mean((2, 3), keepdim=True)),
    }


#: Working set the calibration cycles through per kernel: larger than the last-level
#: cache, so that big tensors come from memory as they do in training, while small ones
#: stay cached as they do there too.
_WORKING_SET = 64 << 20


def _copies(nbytes: float, limit: int = 8) -> int:
    return max(1, min(limit, math.ceil(_WORKING_SET / max(nbytes, 1))))


def _fault_cost(sync) -> float:
    """Seconds per byte that first writing a freshly mapped block costs beyond writing
    mapped memory: a 128 MiB tensor (above :data:`FRESH_LIMIT`, so each allocation is a
    new mapping) allocated and filled, against filling one that stays allocated."""
    import torch

    n = (128 << 20) // 4
    kept = torch.empty(n)
    kept.fill_(1.0)
    sync()
    warm = _timed(lambda: kept.fill_(1.0), min_seconds=0.05)
    sync()
    fresh = _timed(lambda: torch.empty(n).fill_(1.0), min_seconds=0.05)
    return max(0.0, fresh - warm) / (4 * n)


def _keep_freed_memory() -> bool:
    """Make the C library keep freed memory in the heap (glibc ``mallopt``: no mmap for
    blocks under 1 GiB, no trimming), so that kernel timings exclude page faults, which
    :func:`_fault_cost` measures apart. Returns False where that is not available."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3      # <malloc.h>
    return bool(mallopt(m_mmap_threshold, 1 << 30)) and bool(mallopt(m_trim_threshold, 1 << 30))


def _timed_cycle(fns, wait=None) -> float:
    """Seconds per call of a kernel built on several copies of its tensors, called in turn."""
    return _timed(lambda: [f() for f in fns], wait=wait) / len(fns)


def calibrate_kernels(threads: int, *, seed: int = 0, per_class: int = 32, quick: bool = False,
                       barrier=None, device: str = "cpu") -> dict:
    """Time the representative kernels on this process (``threads`` intra-op threads)
    on ``device`` (``cpu``, or ``cuda`` for the current GPU).

    On the CPU, first the page-fault cost of fresh allocations (:func:`_fault_cost`);
    then, with the C library keeping freed memory (:func:`_keep_freed_memory`, which
    stays in force for the process: run it in a process of its own), each kernel cycles
    through enough copies of its tensors to exceed the last-level cache
    (:data:`_WORKING_SET`). Where the C library cannot be told to keep freed memory,
    the kernels' own timings include the faults of their outputs above
    :data:`FRESH_LIMIT`, and the fault cost is 0 so that they are not charged twice.
    Last (not ``quick``), the :data:`REFERENCE_MODELS`' training steps.
    Returns ``{"conv", "gemm", "memory", "view", "fault"}`` as :class:`Profile` holds
    them, and ``"steps"`` (:func:`_reference_steps`; empty when ``quick``)."""
    import torch

    torch.set_num_threads(threads)
    dev = torch.device(device)
    sync = barrier or (lambda: None)
    wait = torch.cuda.synchronize if dev.type == "cuda" else None
    fault = 0.0
    if dev.type == "cpu":
        fault = _fault_cost(sync)
        if not _keep_freed_memory():
            fault = 0.0
    with dev:   # every tensor the kernels use is made on the device
        kernels = _time_kernels(seed, per_class, quick, sync, wait)
    # A quick profile's kernels are priced from too few, too small shapes to scale a
    # whole step by: it keeps factor 1.
    return {**kernels, "fault": fault,
            "steps": {} if quick else _reference_steps(device, sync, parallel=barrier is not None)}


def _time_kernels(seed: int, per_class: int, quick: bool, sync, wait) -> dict:
    """The kernel timings of :func:`calibrate_kernels` on the default device; ``sync``
    lines the ranks up before each timing, ``wait`` finishes queued device work."""
    import torch

    rng = np.random.default_rng(seed)
    aten = torch.ops.aten
    per_class = 8 if quick else per_class
    # Up to 40 GFLOP: VGG's convolutions at batch 32 and 128x128 reach 39.
    max_flops = 2e8 if quick else 4e10
    conv: dict[str, list] = {}
    for cls in ("k1", "k3", "kn", "dw", "group"):
        for n, cin, h, cout, k, stride, groups in _conv_shapes(cls, rng, per_class, max_flops):
            w_shape = (cout, cin // groups, k, k)
            out_numel = None
            fns: dict[str, list] = {"conv": [], "dgrad": [], "wgrad": []}
            copies = 1
            for c in range(8):
                x, w = torch.randn(n, cin, h, h), torch.randn(*w_shape)
                out = torch.nn.functional.conv2d(x, w, None, stride, k // 2, 1, groups)
                if out_numel is None:
                    out_numel = out.numel()
                    size = 4 * (x.numel() + w.numel() + out_numel)
                    copies = _copies(size)
                g = torch.randn_like(out)
                args = (g, x, w, None, [stride] * 2, [k // 2] * 2, [1, 1], False, [0, 0], groups)
                fns["conv"].append(lambda x=x, w=w: torch.nn.functional.conv2d(x, w, None, stride, k // 2, 1, groups))
                fns["dgrad"].append(lambda a=args: aten.convolution_backward(*a, [True, False, False]))
                fns["wgrad"].append(lambda a=args: aten.convolution_backward(*a, [False, True, False]))
                if c + 1 >= copies:
                    break
            dims = [out_numel // cout, cout, cin // groups * k * k]
            for kind, calls in fns.items():
                sync()
                conv.setdefault(f"{kind}:{cls}", []).append((dims, size, _timed_cycle(calls, wait)))
    gemm = []
    while len(gemm) < per_class:
        # Batch-sized rows against layer-sized matrices, as classifier layers multiply.
        m = int(rng.choice([8, 16, 32, 64, 128, 256, 512, 1024, 2048]))
        k, n = (int(rng.choice([256, 512, 1000, 1024, 2048, 4096, 9216, 25088])) for _ in range(2))
        size = 4 * (m * k + k * n + m * n)
        if 2.0 * m * k * n > max_flops or size > (64 << 20 if quick else 512 << 20):
            continue
        pairs = [(torch.randn(m, k), torch.randn(k, n)) for _ in range(_copies(size))]
        sync()
        gemm.append(([m, n, k], size, _timed_cycle([lambda p=p: p[0] @ p[1] for p in pairs], wait)))
    memory = {}
    sizes = [1 << e for e in range(12, 21 if quick else 25, 2)]
    for name, build in _memory_kernels(torch).items():
        table: list[list] = [[], []]
        for n in sizes:
            first = build(n)
            moved = _recorded_bytes(first, name)
            calls = [first] + [build(n) for _ in range(_copies(moved) - 1)]
            sync()
            table[0].append(moved)
            table[1].append(_timed_cycle(calls, wait))
        memory[name] = table
    memory["*"] = memory["add"]        # unlisted operators priced as a binary elementwise op
    x = torch.randn(64)
    view = _timed(lambda: x.view(8, 8), wait=wait)
    return {"conv": {k: fit_dims(v) for k, v in conv.items()},
            "gemm": fit_dims(gemm), "memory": memory, "view": view}


def _recorded_bytes(fn, name: str) -> float:
    """Bytes the dispatch recorder assigns to the first ``name`` operator that ``fn`` runs
    (the same accounting as :func:`workload`)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    found = []

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.overloadpacket.__name__ == name and not found:
                found.append(record_op(func, args, kwargs or {}, out, "calibration"))
            return out

    with Recorder():
        fn()
    if not found:
        raise RuntimeError(f"calibration kernel for {name} did not run {name}")
    return found[0].bytes


def run_ranks(target, procs: int, *args, timeout: float = 3600.0):
    """Run ``target(rank, procs, port, queue, *args)`` in ``procs`` spawned processes
    joined by gloo on a free local port; returns what rank 0 puts on the queue.

    Raises:
        RuntimeError: a rank exited with an error, or no result came within ``timeout``
            seconds (the ranks are then terminated).
    """
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    workers = [ctx.Process(target=target, args=(rank, procs, port, queue, *args)) for rank in range(procs)]
    for w in workers:
        w.start()
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                return queue.get(timeout=1.0)
            except queues.Empty:
                failed = [w.exitcode for w in workers if w.exitcode not in (None, 0)]
                if failed or time.monotonic() > deadline:
                    raise RuntimeError(f"{target.__name__}: rank exit codes {[w.exitcode for w in workers]}"
                                       f"{'' if failed else ' (timed out)'}") from None
    finally:
        for w in workers:
            w.join(timeout=30)
            if w.is_alive():
                w.terminate()
                w.join()


def _calibrate_worker(rank: int, procs: int, port: int, queue, threads: int, quick: bool) -> None:
    """One of ``procs`` processes timing kernels at the same time (so memory bandwidth and
    caches are shared as in data-parallel training), training the reference models as
    ``DistributedDataParallel`` ranks (:func:`_reference_steps`), then the all-reduce
    between them."""
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=procs)
    try:
        result = calibrate_kernels(threads, quick=quick, barrier=dist.barrier)
        samples = []
        for size in [1 << 12, 1 << 16, 1 << 20, 1 << 22, 1 << 24] + ([] if quick else [1 << 26]):
            x = torch.ones(size // 4)
            # Every rank must make the same number of calls: a fixed count, not _timed's.
            calls = max(3, min(50, (1 << 24) // size))
            dist.all_reduce(x)
            dist.barrier()
            start = time.perf_counter()
            for _ in range(calls):
                dist.all_reduce(x)
            samples.append((size, (time.perf_counter() - start) / calls))
        # t = 2 (p - 1) latency + 2 (p - 1) / p * bytes / rate  (ring)
        latency, rate = _fit_linear([(2 * (procs - 1) / procs * b, t) for b, t in samples])
        result["allreduce"] = [latency / (2 * (procs - 1)), rate]
        if rank == 0:
            queue.put(result)
    finally:
        dist.destroy_process_group()


def _calibrate_alone(rank: int, procs: int, port: int, queue, threads: int, quick: bool,
                     device: str = "cpu") -> None:
    """One process timing kernels (no all-reduce), in a process of its own because
    :func:`calibrate_kernels` changes the C library's allocator settings."""
    result = calibrate_kernels(threads, quick=quick, device=device)
    result["allreduce"] = [0.0, float("inf")]
    queue.put(result)


def _decode_per_core() -> float:
    """JPEG decodes per second on one core through the CPU path: a scikit-image photograph
    scaled to the ImageNet samples' mean size and saved at quality 90, 4:2:0."""
    from PIL import Image


    try:
        from skimage import data as photos

        image = Image.fromarray(photos.astronaut())
    except ImportError:
        rng = np.random.default_rng(0)
        image = Image.fromarray(rng.integers(0, 255, (512, 512, 3), dtype=np.uint8))
    side = int(math.sqrt(202_698 / 0.75))
    buf = io.BytesIO()
    image.resize((side, int(side * 0.75))).save(buf, "JPEG", quality=90, subsampling=2)
    data = buf.getvalue()
    return 1.0 / _timed(lambda: decode(data, backend="cpu"), min_seconds=0.2)


def calibrate(*, procs: int = 1, threads: int | None = None, quick: bool = False,
              name: str | None = None, device: str = "cpu") -> Profile:
    """Measure a profile of this machine's CPU, or of its current GPU (see the module
    docstring).

    Args:
        procs: processes timing at once (data-parallel ranks per node; ``> 1`` also
            measures the gloo all-reduce between them; CPU only).
        threads: intra-op threads per process (default: cores / procs).
        quick: fewer and smaller kernels (tests; seconds instead of minutes).
        name: profile name (default ``cpu-p{procs}``; ``cuda`` for a GPU).
        device: ``cpu`` or ``cuda``. A GPU profile has one device: no all-reduce is
            measured (:func:`predict` refuses it for several ranks), communication is
            taken as overlapped (NCCL's own stream) and no page faults are charged (the
            CUDA caching allocator reuses memory).

    Returns:
        The :class:`Profile` (``source`` names the machine and date, and the GPU), with
        its ``step_factor`` from the :data:`REFERENCE_MODELS`' training steps (1 when
        ``quick``).

    Raises:
        ValueError: ``procs > 1`` on a GPU; RuntimeError: no CUDA device.
    """
    cores = os.cpu_count() or 1
    threads = threads or max(1, cores // procs)
    when = f"{datetime.date.today().isoformat()}{' (quick)' if quick else ''}"
    if device != "cpu":
        import torch

        if procs != 1:
            raise ValueError("a GPU profile is calibrated with one process")
        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA device: calibrate the CPU instead")
        result = run_ranks(_calibrate_alone, 1, threads, quick, "cuda")
        source = (f"measured by `dlbooster predict calibrate --device cuda` on {platform.node()}, "
                  f"{torch.cuda.get_device_name()}, {when}")
        profile = Profile(name=name or "cuda", kind="gpu", source=source, threads=threads, procs=1,
                          conv=result["conv"], gemm=result["gemm"], memory=result["memory"],
                          view=result["view"], allreduce=result["allreduce"], overlap=1.0,
                          decode_per_core=_decode_per_core(), host_us_per_image=HOST_US_PER_IMAGE)
    else:
        result = run_ranks(_calibrate_alone if procs == 1 else _calibrate_worker, procs, threads, quick)
        source = (f"measured by `dlbooster predict calibrate` on {platform.node()} ({platform.machine()}, "
                  f"{cores} cores), {procs} process(es) x {threads} thread(s), {when}")
        profile = Profile(name=name or f"cpu-p{procs}", kind="cpu", source=source, threads=threads, procs=procs,
                          conv=result["conv"], gemm=result["gemm"], memory=result["memory"], view=result["view"],
                          allreduce=result["allreduce"], overlap=0.0,
                          decode_per_core=_decode_per_core(), host_us_per_image=HOST_US_PER_IMAGE,
                          fault=result["fault"])
    profile.step_factor = step_factor(profile, result["steps"])
    return profile


# --------------------------------------------------------------------------- shipped profiles
