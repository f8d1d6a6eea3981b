"""The work of one training step (``dlbooster predict``): the real torchvision model run on
PyTorch's ``meta`` device under a dispatch mode that records every ATen operator with its
tensors (:func:`workload`); FLOPs and matrix-product dimensions for convolutions and
matrix products, bytes for every other operator, and when each parameter's gradient is
ready (the package docstring gives the formulas)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["FRESH_LIMIT", "Op", "Workload", "conv_class", "record_op", "build_model", "workload",
           "REFERENCE_MODELS"]


#: Operators that only make views or metadata: no bytes moved.
_VIEWS = {"view", "_unsafe_view", "t", "detach", "slice", "expand", "as_strided", "transpose",
          "permute", "unsqueeze", "squeeze", "reshape", "alias", "select", "split", "split_with_sizes",
          "chunk", "unbind", "narrow", "empty", "empty_like", "empty_strided", "new_empty",
          "new_empty_strided", "lift_fresh", "_reshape_alias", "unflatten", "flatten",
          "_record_function_enter_new", "_record_function_exit"}

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


def record_op(func, args, kwargs, out, phase) -> Op:
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
            rec = record_op(func, args, kwargs or {}, out, state["phase"])
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

#: Models whose measured training steps set a calibrated profile's ``step_factor``: none
#: of ``dlbooster predict validate``'s default models, and of two kinds (inverted
#: residual blocks with depthwise convolutions; plain residual blocks), with the
#: (batch size, image side) they are trained at: the middle of the validation's range.
REFERENCE_MODELS = {"mnasnet0_5": (16, 128), "resnet34": (16, 128)}
