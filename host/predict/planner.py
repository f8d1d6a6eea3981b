"""Iteration-time predictor and capacity planner (``dlbooster predict``).

After Pei et al., "Iteration Time Prediction for CNN in Multi-GPU Platform" (IEEE Access
2019): the iteration time of data-parallel CNN training predicted from the model's
per-layer work, a device profile and the network, with the limiting stage named.

- Work (:func:`workload`): the real torchvision model runs one training step (forward,
  cross-entropy, backward, SGD with momentum and weight decay) on PyTorch's ``meta``
  device, which computes shapes but no values, under a dispatch mode that records every
  ATen operator with its tensors. Convolutions and matrix products get their FLOPs
  (``2 * N * Cout * Ho * Wo * Cin / groups * kh * kw``; the backward's input gradient and
  weight gradient, ``convolution_backward``'s output mask, each as much as the forward)
  and their matrix-product dimensions (im2col form), every other operator the bytes it
  reads and writes; views move nothing. Gradient
  readiness (which backward operator completes each parameter's gradient) is recorded
  too, for the communication overlap.
- Device (:class:`Profile`): per-operator cost functions. ``dlbooster predict calibrate``
  measures them on the machine at hand by timing representative kernels (convolutions of
  a seeded random shape grid, not the validated models' layers; memory-bound operators
  at several sizes; all-reduces between local processes); shipped GPU profiles come from
  public peak figures and are marked as such. On the CPU, every tensor of at least 32 MiB
  is a fresh mapping of the C library's (glibc's mmap threshold), page-faulted in as it
  is written: that cost is measured apart (the kernels are timed with freed memory
  kept) and charged per byte of such outputs, which is what makes large batches and
  VGG's classifier gradients slower than their kernels. Calibration ends by training
  :data:`REFERENCE_MODELS` (models no validation uses by default) for a few steps: their
  measured step over their operators' summed prices is the profile's ``step_factor``,
  by which every operator's price is multiplied (the framework's work per operator and
  kernels slowed by their neighbours' data, which kernels timed alone miss).
- Communication: gradients in DistributedDataParallel's buckets (in the order they
  become ready, as DDP rebuilds them after its first iteration; 1 MiB first bucket,
  25 MiB after), each all-reduced by a ring as soon as its last gradient is ready:
  ``2 (p - 1) latency + 2 (p - 1) / p * bytes / bandwidth``, bandwidth the slower of the
  intra-node link and, with several nodes, the network. Communication under the
  backward is hidden as far as the profile's ``overlap`` says. ``split``
  (:class:`dlbooster.train.schedule.SplitBackward`) adds its measured CPU overhead; its GPU
  side streams are not modelled as faster (not yet measured on a GPU).
- Input: the decoder's rate (``LANESxMHZ``: lanes x clock / clocks per image, the lane's
  measured clocks per ImageNet photo, :data:`dlbooster.hw.build.synth.IMAGENET_CLOCKS`) or a CPU
  decode rate per core, and the host runtime's cost per image.

The iteration takes the longest of compute plus exposed communication, decode and host
work; that stage is the bottleneck.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = ["HOST_US_PER_IMAGE", "Op", "PROFILE_LIMITS", "Profile", "SHIPPED_PROFILES", "Workload", "build_model",
           "buckets", "calibrate", "load_profile", "op_time", "parse_decoder", "predict", "profile_dir",
           "REFERENCE_MODELS", "run_ranks", "time_steps", "workload"]

#: Operators that only make views or metadata: no bytes moved.
_VIEWS = {"view", "_unsafe_view", "t", "detach", "slice", "expand", "as_strided", "transpose",
          "permute", "unsqueeze", "squeeze", "reshape", "alias", "select", "split", "split_with_sizes",
          "chunk", "unbind", "narrow", "empty", "empty_like", "empty_strided", "new_empty",
          "new_empty_strided", "lift_fresh", "_reshape_alias", "unflatten", "flatten",
          "_record_function_enter_new", "_record_function_exit"}

#: Host runtime cost per image, microseconds, file reads included: ``dlbooster bench host``
#: (docs/benchmarks.md, median of eight epochs on the 2-core build machine).
HOST_US_PER_IMAGE = 208.0

#: Allocations of at least this many bytes are mapped afresh on every allocation and
#: unmapped when freed: glibc's largest dynamic mmap threshold (``DEFAULT_MMAP_THRESHOLD_MAX``,
#: 32 MiB on 64-bit; malloc(3), mallopt(3) ``M_MMAP_THRESHOLD``), and PyTorch's CPU
#: allocator keeps no cache. Smaller blocks are reused from the heap.
FRESH_LIMIT = 32 << 20

_CONV = "convolution"
_CONV_BWD = "convolution_backward"
_GEMM = {"mm", "addmm", "bmm", "matmul"}


@dataclass
class Op:
    """One recorded operator.

    Attributes:
        phase: ``forward``, ``backward`` or ``optimizer``.
        name: the ATen operator (overload packet name).
        kind: ``conv``, ``dgrad`` (input gradient), ``wgrad`` (weight gradient),
            ``gemm``, ``memory`` or ``view``.
        flops: floating-point operations (conv, dgrad, wgrad, gemm).
        bytes: bytes read and written (tensors in and out).
        conv_class: the convolution's class (``k1``, ``k3``, ``kn``, ``dw``, ``group``).
        grads: parameter indices whose gradient this operator completes (backward).
        dims: ``[M, N, K]`` of the matrix product (a convolution's im2col form:
            ``M = batch * Ho * Wo``, ``N = Cout``, ``K = Cin / groups * kh * kw``).
        fresh: bytes of the new tensors it returns that are at least
            :data:`FRESH_LIMIT` each: on the CPU the C library maps each of them afresh
            and the kernel page-faults it in as it is written (``Profile.fault``).
            Convolutions add their working copies (:func:`_conv_copies`).
    """

    phase: str
    name: str
    kind: str
    flops: float = 0.0
    bytes: float = 0.0
    conv_class: str = ""
    grads: list = field(default_factory=list)
    dims: list = field(default_factory=list)
    fresh: float = 0.0


@dataclass
class Workload:
    """One training iteration of a model at a batch size, as operators.

    Attributes:
        model, batch_size, image_size: what was recorded.
        ops: the operators in execution order.
        param_bytes: bytes of each parameter's gradient, in ``model.parameters()`` order.
    """

    model: str
    batch_size: int
    image_size: int
    ops: list
    param_bytes: list

    @property
    def gradient_bytes(self) -> int:
        return sum(self.param_bytes)

    @property
    def fresh_bytes(self) -> float:
        """Bytes allocated afresh per iteration (:attr:`Op.fresh`)."""
        return sum(o.fresh for o in self.ops)

    def flops(self, phase: str | None = None) -> float:
        return sum(o.flops for o in self.ops if phase in (None, o.phase))


def conv_class(kernel: tuple, groups: int, in_channels: int) -> str:
    """Class of a convolution for the cost model: depthwise, grouped, or dense by kernel
    size (1x1, up to 3x3, larger)."""
    if groups > 1:
        return "dw" if groups == in_channels else "group"
    k = max(kernel)
    return "k1" if k == 1 else "k3" if k <= 3 else "kn"


def _nbytes(tree) -> int:
    import torch
    from torch.utils._pytree import tree_leaves

    return sum(t.numel() * t.element_size() for t in tree_leaves(tree) if isinstance(t, torch.Tensor))


def _fresh(out, inputs=()) -> int:
    """Bytes of the tensors in ``out`` (not among ``inputs``) of at least
    :data:`FRESH_LIMIT` each."""
    import torch
    from torch.utils._pytree import tree_leaves

    given = {id(t) for t in tree_leaves(inputs)}
    sizes = (t.numel() * t.element_size() for t in tree_leaves(out)
             if isinstance(t, torch.Tensor) and id(t) not in given)
    return sum(n for n in sizes if n >= FRESH_LIMIT)


def _conv_copies(*activations) -> int:
    """Bytes of the working copies a CPU convolution kernel makes of its activation
    tensors (input and output for the forward; output gradient and input gradient for
    the input gradient; input and output gradient for the weight gradient) that are at
    least :data:`FRESH_LIMIT` each. oneDNN, PyTorch's CPU convolution, computes in a
    channel-blocked layout (``nChw8c`` with AVX2) and reorders contiguous NCHW tensors
    into and out of it through temporaries of the same size, each a fresh allocation.
    Measured (minor page faults per call, torch 2.14, oneDNN 3.12): a 3x3 convolution of
    a 128 MiB input into a 256 MiB output faults 640 MiB (output, input copy, output
    copy), its input gradient 512 MiB, its weight gradient 384 MiB; likewise for 1x1,
    5x5, grouped and depthwise convolutions."""
    return sum(n for n in (_nbytes(a) for a in activations) if n >= FRESH_LIMIT)


def _conv_dims(w_shape, out_shape) -> list:
    """``[M, N, K]`` of a convolution (see :class:`Op`)."""
    return [out_shape[0] * math.prod(out_shape[2:]), out_shape[1], math.prod(w_shape[1:])]


def _record(func, args, kwargs, out, phase) -> Op:
    name = func.overloadpacket.__name__
    if name in _VIEWS:
        return Op(phase, name, "view")
    moved = _nbytes((args, kwargs)) + _nbytes(out)
    if name.endswith("_") and out is None:
        # In-place multi-tensor kernels return nothing; they write what they read.
        moved += _nbytes(args[0])
    fresh = 0 if name.endswith("_") else _fresh(out, (args, kwargs))
    if name == _CONV:
        x, w = args[0], args[1]
        dims = _conv_dims(w.shape, out.shape)
        return Op(phase, name, "conv", 2.0 * math.prod(dims), moved,
                  conv_class(tuple(w.shape[2:]), args[8], x.shape[1]), dims=dims,
                  fresh=fresh + _conv_copies(x, out))
    if name == _CONV_BWD:
        grad_out, x, w = args[0], args[1], args[2]
        groups, mask = args[9], args[10]
        dims = _conv_dims(w.shape, grad_out.shape)
        cls = conv_class(tuple(w.shape[2:]), groups, x.shape[1])
        # One op per gradient it computes: each is priced on its own.
        ops = []
        if mask[0]:
            ops.append(Op(phase, name, "dgrad", 2.0 * math.prod(dims), _nbytes((grad_out, w)) + _nbytes(x),
                          cls, dims=dims, fresh=_fresh(out[0]) + _conv_copies(grad_out, out[0])))
        if mask[1]:
            ops.append(Op(phase, name, "wgrad", 2.0 * math.prod(dims), _nbytes((grad_out, x)) + _nbytes(w),
                          cls, dims=dims, fresh=_fresh(out[1]) + _conv_copies(x, grad_out)))
        return ops or [Op(phase, name, "memory", 0.0, moved, fresh=fresh)]
    if name in _GEMM:
        shapes = [a.shape for a in args if hasattr(a, "shape")]
        a, b = shapes[-2], shapes[-1]
        dims = [math.prod(a[:-1]), b[-1], a[-1]]
        return Op(phase, name, "gemm", 2.0 * math.prod(dims), moved, dims=dims, fresh=fresh)
    return Op(phase, name, "memory", 0.0, moved, fresh=fresh)


def build_model(model: str, num_classes: int = 1000):
    """torchvision's classifier ``model`` as trained (GoogLeNet and Inception without
    their auxiliary heads), on the current default device.

    Raises:
        ValueError: not one of torchvision's classification models (the check and the
            message ``dlbooster train`` gives; a helper such as ``list_models`` is none,
            and a segmentation, detection, video, optical-flow or quantized model is
            named as such).
    """
    import torchvision

    models = torchvision.models
    if model not in models.list_models(module=models):
        kinds = {"segmentation": "segmentation", "detection": "detection", "video": "video",
                 "optical_flow": "optical-flow", "quantization": "quantized (int8)"}
        for module, kind in kinds.items():
            if model in models.list_models(module=getattr(models, module)):
                raise ValueError(f"{model!r} is a torchvision {kind} model, not a classification model")
        raise ValueError(f"unknown torchvision classification model {model!r}")
    builder = models.get_model_builder(model)
    kwargs = {"num_classes": num_classes}
    if model in ("googlenet", "inception_v3"):
        kwargs.update(aux_logits=False, init_weights=False)
    return builder(**kwargs)


def workload(model: str, batch_size: int, *, image_size: int = 224, num_classes: int = 1000,
             momentum: float = 0.9, weight_decay: float = 1e-4, foreach: bool = False) -> Workload:
    """Record one training iteration of torchvision's ``model`` (see the module docstring).

    Args:
        model: a torchvision classification model name (``resnet50``, ``vgg11``, ...).
        batch_size: images per iteration per process.
        image_size: square input side, pixels.
        num_classes: the classifier's outputs.
        momentum, weight_decay: the SGD step's settings (they decide its operators).
        foreach: record the SGD step's multi-tensor form (PyTorch's default on CUDA;
            on the CPU it updates one parameter at a time).

    Returns:
        :class:`Workload`; no memory is allocated for activations (meta tensors).
        RegNets, whose builders compute with tensors, hold their parameters on the CPU
        while they are built.

    Raises:
        ValueError: not a torchvision classification model; ``batch_size`` or
            ``image_size`` not a whole number above 0; a model that cannot run at
            ``image_size`` (too small for its pooling, or a fixed input size).
    """
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    for name, value in (("batch_size", batch_size), ("image_size", image_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a whole number above 0, not {value!r}")

    try:
        with torch.device("meta"):
            net = build_model(model, num_classes=num_classes)
    except NotImplementedError:
        # RegNet computes its widths with tensors while it is built, which meta tensors
        # cannot give back as numbers: build it on the CPU once, then drop the values.
        net = build_model(model, num_classes=num_classes).to("meta")
    net.train()
    params = [p for p in net.parameters() if p.requires_grad]
    ops: list[Op] = []
    state = {"phase": "forward"}

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            rec = _record(func, args, kwargs or {}, out, state["phase"])
            ops.extend(rec if isinstance(rec, list) else [rec])
            return out

    def ready(index):
        def hook(_):
            for o in reversed(ops):
                if o.phase == "backward":
                    o.grads.append(index)
                    break
        return hook

    handles = [p.register_post_accumulate_grad_hook(ready(i)) for i, p in enumerate(params)]
    x = torch.empty(batch_size, 3, image_size, image_size, device="meta")
    y = torch.zeros(batch_size, dtype=torch.long, device="meta")
    optimizer = torch.optim.SGD(params, lr=0.1, momentum=momentum, weight_decay=weight_decay, foreach=foreach)
    # A first step outside the recording creates the momentum buffers (a one-off clone).
    try:
        net(x).sum().backward()
    except (RuntimeError, AssertionError, ValueError) as exc:    # e.g. a map pooled below 1x1
        raise ValueError(f"{model} does not run on {image_size}x{image_size}-pixel images ({exc}); "
                         f"give another image size") from None
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    with Recorder():
        loss = torch.nn.functional.cross_entropy(net(x), y)
        state["phase"] = "backward"
        loss.backward()
        state["phase"] = "optimizer"
        optimizer.step()
    for h in handles:
        h.remove()
    return Workload(model, batch_size, image_size, ops, [p.numel() * p.element_size() for p in params])


# --------------------------------------------------------------------------- profiles

@dataclass
class Profile:
    """Cost functions of one device (all times in seconds, sizes in bytes).

    Attributes:
        name, kind: profile name; ``cpu`` or ``gpu``.
        source: how the figures were obtained (``measured ...`` by :func:`calibrate`, or
            ``public peak figures ...``).
        threads, procs: threads per process and processes running at once when measured.
        conv: ``{"conv:k3": cost, "dgrad:dw": cost, ...}`` per kernel kind and class;
            ``gemm``: the matrix-product cost. A cost is ``{"dims": [a, m, n, k, b]}``
            (``log t = a + m log M + n log N + k log K + b log bytes`` over the product's
            dimensions, :class:`Op` ``dims``; fitted to measurements) or
            ``{"roof": [t0, flops/s, bytes/s]}`` (``t0 + max(flops / rate, bytes / bw)``).
            A fitted cost may also hold ``"peak"``: the highest rate (flops/s) measured
            for it; no prediction is faster than its flops at that rate.
        memory: ``{operator: cost}``, a cost being ``[t0, bytes/s]`` or a measured
            table ``[[bytes, ...], [seconds, ...]]`` (:func:`_memory_time`); ``"*"``
            prices unlisted operators.
        view: seconds per view operator (dispatch only).
        allreduce: ``[latency, bytes/s]`` of the ring all-reduce between this device's
            processes on one node (``2 (p - 1) latency + 2 (p - 1) / p * bytes / rate``).
        overlap: share of the all-reduce time under backward compute that is hidden (a
            measured CPU profile: 0, gloo's work competes for the cores the backward
            uses; a GPU: 1, NCCL runs on its own stream).
        decode_per_core: JPEG decodes per second per host core (ImageNet-sized photo).
        host_us_per_image: host runtime cost per image, microseconds (``bench host``).
        fault: seconds per byte of a freshly mapped allocation's first writing (page
            faults: the kernel maps and zeroes each page), charged on ``Op.fresh``;
            measured by :func:`calibrate` with the profile's threads and processes,
            whose kernel timings exclude it. 0: no such cost (GPU profiles: the CUDA
            caching allocator reuses memory; profiles calibrated before it was measured).
        step_factor: what a training step costs over its operators priced one by one
            (module calls, autograd and the optimizer's loop; kernels running beside
            each other's data in the caches): :func:`calibrate` trains the
            :data:`REFERENCE_MODELS` for a few iterations and takes the geometric mean
            of measured over priced step time. Every operator's price is multiplied by
            it (page faults are not). 1: not measured (shipped profiles, ``quick``
            calibrations, profiles calibrated before it was).
    """

    name: str
    kind: str
    source: str
    threads: int
    procs: int
    conv: dict
    gemm: dict
    memory: dict
    view: float
    allreduce: list
    overlap: float
    decode_per_core: float
    host_us_per_image: float
    fault: float = 0.0
    step_factor: float = 1.0

    def save(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=1) + "\n")
        return path


def _cost(spec: dict, op: Op) -> float:
    if "dims" in spec:
        a, *b = spec["dims"]
        logs = [math.log(max(v, 1.0)) for v in (*op.dims, op.bytes)]
        # The log-linear fit's exponents sum below 1 (small products waste more), so
        # beyond the calibrated sizes it would promise rates no kernel reached.
        try:
            fitted = math.exp(a + sum(c * v for c, v in zip(b, logs)))
        except OverflowError:       # beyond a float: predict() refuses the non-finite time
            fitted = math.inf
        return max(fitted, op.flops / spec.get("peak", math.inf))
    t0, rate, bw = spec["roof"]
    return t0 + max(op.flops / rate, op.bytes / bw)


def op_time(profile: Profile, op: Op) -> float:
    """Predicted seconds of one operator on ``profile``: its kernel times the profile's
    ``step_factor``, plus the page faults of its fresh outputs (``op.fresh *
    profile.fault``)."""
    return _kernel_time(profile, op) * profile.step_factor + op.fresh * profile.fault


def _kernel_time(profile: Profile, op: Op) -> float:
    if op.kind == "view":
        return profile.view
    if op.kind in ("conv", "dgrad", "wgrad"):
        spec = profile.conv.get(f"{op.kind}:{op.conv_class}") or profile.conv[f"{op.kind}:k3"]
        return _cost(spec, op)
    if op.kind == "gemm":
        return _cost(profile.gemm, op)
    return _memory_time(profile.memory.get(op.name) or profile.memory["*"], op.bytes)


def _memory_time(spec: list, nbytes: float) -> float:
    """``[t0, bytes/s]``, or a measured table ``[[bytes...], [seconds...]]`` interpolated
    linearly in log-log; below its smallest size its first time, above its largest in
    proportion to the bytes (bandwidth bound)."""
    if not isinstance(spec[0], list):
        t0, bw = spec
        return t0 + nbytes / bw
    sizes, times = spec
    if nbytes <= sizes[0]:
        return times[0]
    if nbytes >= sizes[-1]:
        return times[-1] * nbytes / sizes[-1]
    hi = next(i for i, size in enumerate(sizes) if nbytes <= size)
    x0, x1 = math.log(sizes[hi - 1]), math.log(sizes[hi])
    y0, y1 = math.log(times[hi - 1]), math.log(times[hi])
    return math.exp(y0 + (y1 - y0) * (math.log(nbytes) - x0) / (x1 - x0))


# --------------------------------------------------------------------------- calibration

#: Models whose measured training steps set a calibrated profile's ``step_factor``: none
#: of ``dlbooster predict validate``'s default models, and of two kinds (inverted
#: residual blocks with depthwise convolutions; plain residual blocks), with the
#: (batch size, image side) they are trained at: the middle of the validation's range.
REFERENCE_MODELS = {"mnasnet0_5": (16, 128), "resnet34": (16, 128)}


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
    import statistics

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


def _step_factor(profile: Profile, steps: dict) -> float:
    """Geometric mean over the reference models of their measured step over the sum of
    their operators' prices on ``profile`` (factor 1, no page faults: the calibration
    trains them with freed memory kept), the modelled all-reduce time taken off the
    measured step first for a profile of several processes; 1 without ``steps``."""
    if not steps:
        return 1.0
    from dataclasses import replace

    plain = replace(profile, step_factor=1.0, fault=0.0)
    logs = []
    for name, (batch, side, seconds) in steps.items():
        work = workload(name, int(batch), image_size=int(side), foreach=profile.kind == "gpu")
        priced = sum(_kernel_time(plain, op) for op in work.ops)
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


def _fit_dims(samples: list) -> dict:
    """Least squares of ``log t`` on ``1, log M, log N, log K, log bytes`` over
    ``((M, N, K), bytes, t)`` samples, and the highest rate measured (``peak``,
    ``2 M N K / t`` flops/s)."""
    import numpy as np

    a = np.array([[1.0, *(math.log(v) for v in dims), math.log(b)] for dims, b, _ in samples])
    y = np.array([math.log(t) for _, _, t in samples])
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    peak = max(2.0 * math.prod(dims) / t for dims, _, t in samples)
    return {"dims": [float(c) for c in coef], "peak": peak}


def _fit_linear(samples: list) -> list:
    """``t = t0 + bytes / bw`` over (bytes, t), weighted for relative error; t0, bw >= 0."""
    import numpy as np

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


def _calibrate_kernels(threads: int, *, seed: int = 0, per_class: int = 32, quick: bool = False,
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
    """The kernel timings of :func:`_calibrate_kernels` on the default device; ``sync``
    lines the ranks up before each timing, ``wait`` finishes queued device work."""
    import numpy as np
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
    return {"conv": {k: _fit_dims(v) for k, v in conv.items()},
            "gemm": _fit_dims(gemm), "memory": memory, "view": view}


def _recorded_bytes(fn, name: str) -> float:
    """Bytes the dispatch recorder assigns to the first ``name`` operator that ``fn`` runs
    (the same accounting as :func:`workload`)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    found = []

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.overloadpacket.__name__ == name and not found:
                found.append(_record(func, args, kwargs or {}, out, "calibration"))
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
    import queue as queues
    import socket

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
        result = _calibrate_kernels(threads, quick=quick, barrier=dist.barrier)
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
    :func:`_calibrate_kernels` changes the C library's allocator settings."""
    result = _calibrate_kernels(threads, quick=quick, device=device)
    result["allreduce"] = [0.0, float("inf")]
    queue.put(result)


def _decode_per_core() -> float:
    """JPEG decodes per second on one core through the CPU path: a scikit-image photograph
    scaled to the ImageNet samples' mean size and saved at quality 90, 4:2:0."""
    import io

    import numpy as np
    from PIL import Image

    from dlbooster.backends import decode

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
    import datetime
    import platform

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
    profile.step_factor = _step_factor(profile, result["steps"])
    return profile


# --------------------------------------------------------------------------- shipped profiles

def _gpu_profile(name: str, peak_tflops: float, hbm_gbps: float, link_gbps: float, note: str) -> Profile:
    """A GPU profile from public peak figures: convolutions and matrix products at half the
    peak (cuDNN/cuBLAS typically reach 40-70 % on ResNet layers), memory-bound kernels at
    80 % of the memory bandwidth, 10 us launch and framework cost per kernel, ring
    all-reduce at the link's bus bandwidth with 10 us per step, communication fully
    overlapped with backward compute (NCCL on its own stream)."""
    roof = {"roof": [10e-6, 0.5 * peak_tflops * 1e12, 0.8 * hbm_gbps * 1e9]}
    conv = {f"{kind}:{cls}": roof for kind in ("conv", "dgrad", "wgrad") for cls in ("k1", "k3", "kn", "group")}
    # Depthwise convolutions do not use tensor cores: memory-bound.
    conv.update({f"{kind}:dw": {"roof": [10e-6, 0.05 * peak_tflops * 1e12, 0.5 * hbm_gbps * 1e9]}
                 for kind in ("conv", "dgrad", "wgrad")})
    return Profile(name=name, kind="gpu", source=f"public peak figures ({note}); not measured",
                   threads=0, procs=1, conv=conv, gemm=roof, memory={"*": [10e-6, 0.8 * hbm_gbps * 1e9]},
                   view=5e-6, allreduce=[10e-6, link_gbps * 1e9], overlap=1.0, decode_per_core=600.0,
                   host_us_per_image=HOST_US_PER_IMAGE)


#: GPU profiles from vendor data sheets (dense TF32 tensor throughput, which PyTorch's
#: cuDNN convolutions use by default; HBM bandwidth; NVLink/PCIe bus bandwidth).
SHIPPED_PROFILES = {
    "a100": lambda: _gpu_profile("a100", 156, 1555, 240, "A100 SXM4 40GB: 156 TFLOPS TF32, 1,555 GB/s, NVLink3"),
    "v100": lambda: _gpu_profile("v100", 15.7, 900, 130, "V100 SXM2: 15.7 TFLOPS FP32, 900 GB/s, NVLink2"),
    "h100": lambda: _gpu_profile("h100", 495, 3350, 370, "H100 SXM5: 495 TFLOPS TF32, 3,350 GB/s, NVLink4"),
    "t4": lambda: _gpu_profile("t4", 8.1, 320, 12, "T4: 8.1 TFLOPS FP32, 320 GB/s, PCIe 3"),
}


def profile_dir() -> Path:
    """Where calibrated profiles are kept (``$DLBOOSTER_CACHE/profiles``: the build cache's
    folder, :func:`dlbooster.sim.flow.cache_path`)."""
    from dlbooster.sim.flow import cache_path

    return cache_path() / "profiles"


def load_profile(name: str, *, procs: int = 1) -> Profile:
    """A shipped profile (:data:`SHIPPED_PROFILES`), a calibrated one by name, ``cpu``
    (the calibrated ``cpu-p{procs}``), or a JSON file path.

    Raises:
        FileNotFoundError: no such profile (run ``dlbooster predict calibrate``).
        ValueError: the file is not JSON or not a profile (:func:`profile_from_json`).
    """
    if name in SHIPPED_PROFILES:
        return SHIPPED_PROFILES[name]()
    path = Path(name)
    if not path.suffix and os.sep not in name and not path.is_file():     # a calibrated profile's name
        path = profile_dir() / f"{f'cpu-p{procs}' if name == 'cpu' else name}.json"
    if not path.exists():
        how = {"cpu": f" --procs {procs}", "cuda": " --device cuda"}.get(name, f" --out {path}")
        raise FileNotFoundError(f"no device profile {name!r} ({path}); run `dlbooster predict calibrate{how}` "
                                f"or choose one of {', '.join(SHIPPED_PROFILES)}")
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:     # JSONDecodeError is a ValueError
        raise ValueError(f"{path}: not a readable device profile ({exc})") from None
    try:
        return profile_from_json(raw)
    except ValueError as exc:
        raise ValueError(f"{path}: not a device profile: {exc}") from None


#: What :func:`profile_from_json` accepts: a time (seconds per operator, the all-reduce's
#: latency) of at most an hour; a rate (flops/s, bytes/s, decodes/s) from 0.001 to 1e21 per
#: second (an infinite all-reduce rate or peak: none, as in a one-process profile); a
#: fitted cost's coefficients within +-100 (calibrations give about -26 to 3); a
#: ``step_factor`` from 0.01 to 100 (calibrations give about 1.1); page faults at most a
#: second per byte; host work at most an hour per image.
PROFILE_LIMITS = {"seconds": 3600.0, "rate": (1e-3, 1e21), "coefficient": 100.0, "step_factor": (0.01, 100.0),
                  "fault": 1.0, "host_us_per_image": 3600e6}


def profile_from_json(raw: object) -> Profile:
    """A :class:`Profile` from its JSON object (:meth:`Profile.save`'s), checked: every
    field present and no other, every number finite and within :data:`PROFILE_LIMITS`
    (times at least 0 and at most an hour, rates above 0 and finite except where
    infinite means free: one process's all-reduce, no measured peak), so that no
    prediction comes out negative, infinite or divides by zero (and :func:`predict`
    refuses any time that still overflows a float).

    Raises:
        ValueError: what is wrong, naming the field.
    """
    import dataclasses

    if not isinstance(raw, dict):
        raise ValueError(f"a JSON object is needed, not {type(raw).__name__}")
    fields = {f.name: f for f in dataclasses.fields(Profile)}
    required = {n for n, f in fields.items() if f.default is dataclasses.MISSING}
    if missing := sorted(required - set(raw)):
        raise ValueError(f"missing {', '.join(missing)}")
    if unknown := sorted(set(raw) - set(fields)):
        raise ValueError(f"unknown field(s) {', '.join(unknown)}")
    low, high = PROFILE_LIMITS["rate"]

    def number(value, what: str, *, rate: bool = False, signed: bool = False, free: bool = False,
               most: float = PROFILE_LIMITS["seconds"], unit: str = "seconds") -> None:
        """A time (0 to ``most`` ``unit``), a rate (``free``: may be infinite) or a
        fitted coefficient (``signed``)."""
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            raise ValueError(f"{what} must be a number, not {value!r}")
        if rate:
            if not value > 0:
                raise ValueError(f"{what} is a rate and must be above 0, not {value!r}")
            if not (free and math.isinf(value)) and not low <= value <= high:
                also = " or Infinity" if free else ""
                raise ValueError(f"{what} is a rate per second, from {low:g} to {high:g}{also}, not {value!r}")
        elif signed:
            if not -PROFILE_LIMITS["coefficient"] <= value <= PROFILE_LIMITS["coefficient"]:
                raise ValueError(f"{what} must be finite and within +-{PROFILE_LIMITS['coefficient']:g}, not {value!r}")
        elif not 0 <= value <= most:
            raise ValueError(f"{what} must be finite, at least 0 and at most {most:g} {unit}, not {value!r}")

    def pair(value, what: str, *, free: bool = False) -> None:          # [t0 seconds, bytes/s or flops/s]
        if not isinstance(value, list) or len(value) != 2:
            raise ValueError(f"{what} must be [seconds, rate], not {value!r}")
        number(value[0], f"{what}[0]")
        number(value[1], f"{what}[1]", rate=True, free=free)

    def cost(value, what: str) -> None:
        if not isinstance(value, dict) or not ({"dims", "roof"} & set(value)):
            raise ValueError(f"{what} must be {{'dims': [a, m, n, k, b]}} or {{'roof': [t0, flops/s, bytes/s]}}")
        if "dims" in value:
            dims = value["dims"]
            if not isinstance(dims, list) or len(dims) != 5:
                raise ValueError(f"{what}.dims must be 5 numbers, not {dims!r}")
            for i, d in enumerate(dims):
                number(d, f"{what}.dims[{i}]", signed=True)
        if "roof" in value:
            roof = value["roof"]
            if not isinstance(roof, list) or len(roof) != 3:
                raise ValueError(f"{what}.roof must be [t0, flops/s, bytes/s], not {roof!r}")
            number(roof[0], f"{what}.roof[0]")
            number(roof[1], f"{what}.roof[1]", rate=True)
            number(roof[2], f"{what}.roof[2]", rate=True)
        if "peak" in value:
            number(value["peak"], f"{what}.peak", rate=True, free=True)

    for name in ("name", "kind", "source"):
        if not isinstance(raw[name], str):
            raise ValueError(f"{name} must be a string, not {raw[name]!r}")
    if raw["kind"] not in ("cpu", "gpu"):
        raise ValueError(f"kind must be 'cpu' or 'gpu', not {raw['kind']!r}")
    for name in ("threads", "procs"):
        if isinstance(raw[name], bool) or not isinstance(raw[name], int) or raw[name] < 0:
            raise ValueError(f"{name} must be a whole number, not {raw[name]!r}")
    for name in ("conv", "memory"):
        if not isinstance(raw[name], dict):
            raise ValueError(f"{name} must be an object, not {raw[name]!r}")
    for kind, value in raw["conv"].items():
        cost(value, f"conv[{kind!r}]")
    cost(raw["gemm"], "gemm")
    for op, spec in raw["memory"].items():
        what = f"memory[{op!r}]"
        if isinstance(spec, list) and len(spec) == 2 and all(isinstance(x, list) for x in spec):
            sizes, times = spec
            if not sizes or len(sizes) != len(times):
                raise ValueError(f"{what} must be a table [[bytes, ...], [seconds, ...]] of equal lengths")
            for i, (size, t) in enumerate(zip(sizes, times)):
                if isinstance(size, bool) or not isinstance(size, (int, float)) or not 0 < size < math.inf:
                    raise ValueError(f"{what} bytes[{i}] must be a finite number above 0, not {size!r}")
                number(t, f"{what} seconds[{i}]")
                if not t > 0:
                    raise ValueError(f"{what} seconds[{i}] must be above 0, not {t!r}")
            if any(b <= a for a, b in zip(sizes, sizes[1:])):
                raise ValueError(f"{what}: the table's sizes must rise")
        else:
            pair(spec, what)
    number(raw["view"], "view")
    pair(raw["allreduce"], "allreduce", free=True)
    number(raw["overlap"], "overlap")
    if raw["overlap"] > 1:
        raise ValueError(f"overlap is a share, 0 to 1, not {raw['overlap']!r}")
    number(raw["decode_per_core"], "decode_per_core", rate=True)
    number(raw["host_us_per_image"], "host_us_per_image", most=PROFILE_LIMITS["host_us_per_image"],
           unit="microseconds")
    number(raw.get("fault", 0.0), "fault", most=PROFILE_LIMITS["fault"], unit="seconds per byte")
    step_low, step_high = PROFILE_LIMITS["step_factor"]
    step = raw.get("step_factor", 1.0)
    if isinstance(step, bool) or not isinstance(step, (int, float)) or not step_low <= step <= step_high:
        raise ValueError(f"step_factor must be from {step_low:g} to {step_high:g}, not {step!r}")
    return Profile(**raw)


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
