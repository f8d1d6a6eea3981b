"""Backward-pass scheduling: input gradients on the critical path, weight gradients beside it.

The backward pass of a convolution or linear layer is two independent pieces of work:
the *input gradient* (``dL/dx``), which the next layer down needs before it can start,
and the *weight gradient* (``dL/dW``, ``dL/db``), which only the optimiser and the
gradient all-reduce need. Plain autograd computes both in one node, so every layer's
weight-gradient kernels sit on the critical path. :class:`SplitBackward` splits them, as
DLBooster's GPU helper (Cheng et al., ICPP 2019, section 4) and TurboDL's multi-stream
backward scheduling do:

- each split layer's backward node computes only the input gradient
  (``aten.convolution_backward`` with output mask ``[True, False, False]``, or one
  ``mm`` for a linear layer) and returns it to autograd at once, so autograd's
  dependency order (the layer graph autograd builds from the forward pass) runs the
  critical path first;
- the weight gradient is queued the moment its inputs (the layer's saved input and
  the output gradient just received) are ready. On CUDA it runs on one of ``streams``
  side streams (round-robin), ordered after the main stream by a CUDA event, never by
  host synchronisation; at the end of the backward pass the main stream waits on an
  event per side stream, so ``optimizer.step()`` sees finished gradients. On the CPU
  there are no streams: the same decomposition runs in the same order (input
  gradient, then the weight gradient right after it).
- with a process group, each finished gradient goes to a bucketed asynchronous
  all-reduce (buckets of ``bucket_mb`` in the order the first iteration produced the
  gradients, as DDP's reducer builds them; a bucket is sent as soon as its last
  gradient is in, from the second iteration on; the first iteration sends all at its
  end); other parameters (batch norm, embeddings) and autograd's own contributions to
  tied weights join through post-accumulate hooks. At the end of the backward pass the
  remaining buckets are reduced and every gradient is averaged over the ranks. DDP's
  own reducer cannot be used here: it learns that a gradient is ready only from
  autograd's accumulation into ``.grad``, which split layers do themselves.
- every ``.grad`` update of one parameter happens on one stream (each layer keeps the
  side stream it was first given), autograd's own accumulation into a tied weight
  waits for that stream, and each output gradient read on a side stream is kept
  referenced until the end of the pass, so that autograd cannot add into it in place
  while the side stream reads it.

Results: gradients bitwise equal to plain autograd's on the CPU (the same ATen kernels
run, only separately; tested on ResNet-18/50, DenseNet and Inception blocks, shared and
frozen layers, batch norm, autocast, and two gloo processes against DDP). A parameter
with several gradient contributions (shared by several layers, or one layer used twice,
with a gradient already in ``.grad`` from an earlier pass) gets them summed in backward
order, which may differ from autograd's sum in the last float32 bit.

Layers split: ``nn.Conv1d/2d/3d`` with ``padding_mode="zeros"`` and numeric padding,
``nn.Linear`` (and subclasses that keep their ``forward``), whose weight and bias are
parameters of the layer itself; other layers keep autograd's backward: these with string
padding or other padding modes, and layers whose weight is computed from other
parameters (``weight_norm``, ``spectral_norm``, ``torch.nn.utils.parametrize``), whose
gradient must flow back through that computation. A split layer's weight gradient is
computed when the running backward accumulates into the weight; for
``torch.autograd.grad(out, inputs)`` that names the weight or bias it is returned to
autograd like any other gradient (on the main stream).

Limits: tensor hooks (``register_hook``) on a split layer's weight or bias are called
with ``None`` and cannot change its gradient, and without a process group their
post-accumulate hooks are not called: the gradient goes into ``.grad`` beside autograd.
A copy of the model (``copy.deepcopy``, or ``torch.save`` of the whole module and
``torch.load``) has plain layers. With a process group every rank must produce the same
gradients in the same order every iteration (a static graph, as DDP's ``static_graph``; a parameter with
more contributions than in the first iteration raises ``RuntimeError``; a graph that
differs between ranks can hang the collectives); unused parameters are reduced as
zeros; reentrant activation checkpointing is not supported (its inner backward passes
would end the schedule's pass early). With ``trace`` on CUDA, the end of each backward
pass waits on the host for the timing events.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import types
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.autograd.graph import get_gradient_edge

__all__ = ["SplitBackward", "split_layers"]

_aten = torch.ops.aten


def split_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The ``(name, module)`` pairs of ``model`` whose backward :class:`SplitBackward`
    splits, in module order (the module docstring says which)."""
    found = []
    for name, m in model.named_modules():
        base = next((c for c in (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d) if isinstance(m, c)), None)
        if base is None or type(m).forward is not base.forward:   # a subclass with its own forward
            continue
        own_forward = m.__dict__.get("forward")
        if own_forward is not None and not getattr(getattr(own_forward, "__func__", None), "split", False):
            continue                              # the user's own forward on the instance
        own = m._parameters
        if own.get("weight") is not m.weight or own.get("bias", None) is not m.bias:
            continue                              # weight_norm, parametrizations: computed weights
        if base is nn.Linear or (m.padding_mode == "zeros" and not isinstance(m.padding, str)):
            found.append((name, m))
    return found


def _autocast_dtype(device_type: str) -> torch.dtype | None:
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return None


class _SplitLayer(torch.autograd.Function):
    """``y = layer(x)`` whose backward returns only the input gradient and hands the
    weight gradient to the scheduler."""

    @staticmethod
    def forward(ctx, x, weight, bias, layer, scheduler):
        dtype = _autocast_dtype(x.device.type)
        if dtype is not None and x.is_floating_point():
            # Autocast's casts, made here so that backward sees the tensors the kernel saw.
            x, weight = x.to(dtype), weight.to(dtype)
            bias = bias.to(dtype) if bias is not None else None
        with torch.autocast(x.device.type, enabled=False):
            if isinstance(layer, nn.Linear):
                y = F.linear(x, weight, bias)
            else:
                conv = (F.conv1d, F.conv2d, F.conv3d)[weight.dim() - 3]
                y = conv(x, weight, bias, layer.stride, layer.padding, layer.dilation, layer.groups)
        ctx.save_for_backward(x, weight)
        ctx.layer, ctx.scheduler, ctx.has_bias = layer, scheduler, bias is not None
        return y

    @staticmethod
    def backward(ctx, grad_y):
        x, weight = ctx.saved_tensors
        layer, scheduler = ctx.layer, ctx.scheduler
        unbatched = not isinstance(layer, nn.Linear) and x.dim() == weight.dim() - 1
        if unbatched:                            # ATen's convolution backward wants a batch
            x, grad_y = x.unsqueeze(0), grad_y.unsqueeze(0)
        grad_x = None
        if ctx.needs_input_grad[0]:
            with scheduler._span(f"input-grad {scheduler.names[layer]}", "input-grad"):
                grad_x = _input_grad(layer, grad_y, x, weight)
                if unbatched:
                    grad_x = grad_x.squeeze(0)
        # backward(inputs=...) and torch.autograd.grad(..., inputs) may not want them;
        # autograd.grad wants those it names returned (None: _wanted).
        want_w = _wanted(layer.weight) if ctx.needs_input_grad[1] else False
        want_b = _wanted(layer.bias) if ctx.has_bias and ctx.needs_input_grad[2] else False
        grad_w = grad_b = None
        if want_w is None or want_b is None:
            grad_w, grad_b = _weight_grads(layer, grad_y, x, weight, want_w is None, want_b is None)
            grad_w = grad_w.to(layer.weight.dtype) if grad_w is not None else None
            grad_b = grad_b.to(layer.bias.dtype) if grad_b is not None else None
        scheduler._weight_grad(layer, grad_y, x, weight, want_w is True, want_b is True)
        return grad_x, grad_w, grad_b, None, None


def _wanted(param: nn.Parameter) -> bool | None:
    """Whether the running backward pass accumulates into ``param`` (True), does not need
    its gradient (False), or is a ``torch.autograd.grad`` that returns it (None)."""
    try:
        return torch._C._will_engine_execute_node(get_gradient_edge(param).node)
    except RuntimeError as exc:
        # autograd.grad captures a leaf's gradient from the edge instead of running its
        # accumulation node; the engine raises when asked about such a node.
        if "autograd.grad" not in str(exc):
            raise
        return None


def _input_grad(layer: nn.Module, grad_y, x, weight):
    if isinstance(layer, nn.Linear):
        return grad_y.matmul(weight)
    n = weight.dim() - 2
    return _aten.convolution_backward(grad_y, x, weight, None, layer.stride, layer.padding,
                                      layer.dilation, False, [0] * n, layer.groups,
                                      [True, False, False])[0]


def _weight_grads(layer: nn.Module, grad_y, x, weight, want_w: bool, want_b: bool):
    if isinstance(layer, nn.Linear):
        gy = grad_y.reshape(-1, grad_y.shape[-1])
        gw = gy.t().mm(x.reshape(-1, x.shape[-1])) if want_w else None
        gb = gy.sum(0) if want_b else None
        return gw, gb
    n = weight.dim() - 2
    _, gw, gb = _aten.convolution_backward(grad_y, x, weight, [weight.shape[0]] if want_b else None,
                                           layer.stride, layer.padding, layer.dilation, False,
                                           [0] * n, layer.groups, [False, want_w, want_b])
    return gw, gb


class _Reducer:
    """Bucketed asynchronous all-reduce of gradients as they finish (mean over ranks)."""

    def __init__(self, params: list[nn.Parameter], group, bucket_bytes: int, sync: Callable):
        self.params, self.group, self.bucket_bytes, self.sync = params, group, bucket_bytes, sync
        self.world = dist.get_world_size(group)
        self.order: list[nn.Parameter] = []      # first iteration's readiness order
        self.uses: dict[nn.Parameter, int] = {}  # gradient contributions per iteration
        self.buckets: list[list[nn.Parameter]] = []
        self.bucket_of: dict[nn.Parameter, int] = {}
        self._reset()

    def _reset(self) -> None:
        self.seen: dict[nn.Parameter, int] = {}
        self.left = [len(b) for b in self.buckets]
        self.works: list[tuple] = []

    def ready(self, p: nn.Parameter) -> None:
        """One gradient contribution of ``p`` is in ``p.grad``."""
        count = self.seen.get(p, 0) + 1
        self.seen[p] = count
        if not self.buckets:
            if count == 1:
                self.order.append(p)
            return
        b = self.bucket_of.get(p)
        if b is None:
            return
        want = self.uses.get(p, 1)
        if count > want:
            raise RuntimeError("a parameter received more gradient contributions than in the first "
                               "iteration; SplitBackward needs the same graph every iteration")
        if count == want:
            self.left[b] -= 1
            if self.left[b] == 0:
                self._launch(b)

    def abandon(self) -> None:
        """Forget a backward pass that failed midway (its launched buckets finish unused)."""
        for _, _, work in self.works:
            work.wait()
        if not self.buckets:                     # the plan comes from a complete first pass
            self.order.clear()
        self._reset()

    def _launch(self, b: int) -> None:
        params = self.buckets[b]
        self.sync()
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                          for p in params])
        self.works.append((b, flat, dist.all_reduce(flat, group=self.group, async_op=True)))

    def finish(self) -> None:
        """Reduce what is left, wait for every bucket, write back the averaged gradients."""
        if not self.buckets:                     # first iteration: plan the buckets now
            rest = [p for p in self.params if p not in self.seen]
            self.uses = dict(self.seen)
            size, current = 0, []
            for p in self.order + rest:
                current.append(p)
                size += p.numel() * p.element_size()
                if size >= self.bucket_bytes:
                    self.buckets.append(current)
                    size, current = 0, []
            if current:
                self.buckets.append(current)
            self.bucket_of = {p: b for b, ps in enumerate(self.buckets) for p in ps}
            self.left = [len(b) for b in self.buckets]
        launched = {b for b, _, _ in self.works}
        for b in range(len(self.buckets)):
            if b not in launched:
                self._launch(b)
        for b, flat, work in self.works:
            work.wait()
            flat.div_(self.world)
            offset = 0
            for p in self.buckets[b]:
                n = p.numel()
                view = flat[offset:offset + n].view_as(p)
                if p.grad is None:
                    p.grad = view.clone()
                else:
                    p.grad.copy_(view)
                offset += n
        self._reset()


class SplitBackward:
    """Split the backward pass of ``model``'s convolution and linear layers (see the
    module docstring). Installs on construction; :meth:`remove` restores the model.

    Args:
        model: the module; its split layers' ``forward`` is replaced (state dicts and
            parameters are untouched).
        streams: side CUDA streams for weight gradients (ignored on the CPU).
        process_group: all-reduce gradients over this group (``None``: the default
            group when ``torch.distributed`` is initialised with more than one rank,
            else no reduction). Parameters and buffers are broadcast from rank 0 at
            construction, and buffers before every forward pass, as DDP does.
        bucket_mb: all-reduce bucket size, megabytes (DDP's default is 25).
        trace: a :class:`dlbooster.train.trace.Trace` to record every input- and
            weight-gradient task in (CUDA tasks are timed with CUDA events).

    Raises:
        TypeError: ``model`` is not an ``nn.Module``, ``streams`` not an int.
        ValueError: ``streams`` below 1, ``bucket_mb`` not a positive finite number, or
            a lazy layer (``nn.LazyLinear``, ...) not yet initialised by a forward pass.

    Use: ``loss.backward()`` as usual, then ``optimizer.step()``; gradients are final
    (and reduced) when ``backward()`` returns.
    """

    def __init__(self, model: nn.Module, *, streams: int = 2, process_group=None,
                 bucket_mb: float = 25.0, trace=None):
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, not {type(model).__name__}")
        if not isinstance(streams, numbers.Integral) or isinstance(streams, bool):
            raise TypeError(f"streams must be an int, not {streams!r}")
        if streams < 1:
            raise ValueError(f"streams must be at least 1, not {streams}")
        if (not isinstance(bucket_mb, numbers.Real) or isinstance(bucket_mb, bool)
                or not math.isfinite(bucket_mb) or bucket_mb <= 0):
            raise ValueError(f"bucket_mb must be a positive number of megabytes, not {bucket_mb!r}")
        for name, p in model.named_parameters():
            if isinstance(p, nn.parameter.UninitializedParameter):
                raise ValueError(f"parameter {name} is not initialised yet (a lazy layer): run one "
                                 f"forward pass before SplitBackward")
        self.model, self.trace = model, trace
        self.layers = split_layers(model)
        self.names = {m: name or type(m).__name__ for name, m in self.layers}
        self._streams: list = []
        self._nstreams = int(streams)
        self._stream_of: dict[int, object] = {}  # id(weight) -> its side stream
        self._task: int | None = None             # the autograd graph task being served
        self._used_streams: set = set()
        self._mains: set = set()                  # streams the backward ran on
        self._held: list = []                     # output gradients read on side streams
        self._gpu_spans: list = []
        self.backward_order: list[str] = []     # split layers in the first backward's order
        self._recording = True
        group = process_group
        if group is None and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            group = dist.group.WORLD
        self._reducer = None
        self._handles = []
        try:
            for _, m in self.layers:
                for p in (m.weight, m.bias):
                    if p is not None and p.requires_grad:
                        self._handles.append(p.register_hook(self._before_autograd_accumulates(p)))
            if group is not None:
                params = [p for p in model.parameters() if p.requires_grad]
                self._broadcast(group)
                self._reducer = _Reducer(params, group, int(bucket_mb * 2**20), self._join_streams)
                for p in params:            # autograd's accumulations count as contributions too
                    self._handles.append(p.register_post_accumulate_grad_hook(self._accumulated))
                self._handles.append(model.register_forward_pre_hook(lambda m, a: self._broadcast_buffers(group)))
        except BaseException:
            self.remove()                 # a bad process group: leave the model as it was
            raise
        for _, m in self.layers:
            m.forward = self._forward_of(m)

    def _broadcast(self, group) -> None:
        src = dist.get_global_rank(group, 0) if group is not dist.group.WORLD else 0
        with torch.no_grad():
            for t in list(self.model.parameters()) + list(self.model.buffers()):
                dist.broadcast(t.data, src, group=group)

    def _broadcast_buffers(self, group) -> None:
        if self.model.training:
            src = dist.get_global_rank(group, 0) if group is not dist.group.WORLD else 0
            with torch.no_grad():
                for t in self.model.buffers():
                    dist.broadcast(t, src, group=group)

    def _forward_of(self, layer: nn.Module) -> Callable:
        # A method of the layer, so that a deep copy of it is bound to the copy, which then
        # computes as a plain layer; named ``forward``, so that unpickling finds the class's.
        def forward(module, x):
            if module is not layer:
                return type(module).forward(module, x)
            return _SplitLayer.apply(x, module.weight, module.bias, module, self)
        forward.split = True
        return types.MethodType(forward, layer)

    def remove(self) -> None:
        """Give the layers their own ``forward`` back and drop the hooks."""
        for _, m in self.layers:
            m.__dict__.pop("forward", None)
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()

    # -- scheduling ----------------------------------------------------------------

    def _begin(self) -> None:
        """First task of a backward pass: queue the end-of-backward callback. A pass that
        failed never ran its callback: its leftovers are dropped here."""
        task = torch._C._current_graph_task_id()
        if task == self._task:
            return
        if self._task is not None:
            self._held.clear()
            if self._reducer is not None:
                self._reducer.abandon()
        self._task = task
        torch.autograd.Variable._execution_engine.queue_callback(self._end)

    def _side_stream(self, layer: nn.Module):
        """The layer's side stream: round-robin over the streams at first use, then
        fixed, so that every update of one parameter's ``.grad`` is on one stream."""
        key = id(layer.weight)
        s = self._stream_of.get(key)
        if s is None:
            if not self._streams:
                self._streams = [torch.cuda.Stream(layer.weight.device) for _ in range(self._nstreams)]
            s = self._stream_of[key] = self._streams[len(self._stream_of) % len(self._streams)]
        return s

    def _before_autograd_accumulates(self, p: nn.Parameter) -> Callable:
        # Autograd calls it for every contribution to p, with None for a split layer's
        # (which returns no weight gradient); a tensor is autograd's own, from a use of p
        # outside split layers (tied weights), and its add must follow ours.
        def hook(grad):
            s = self._stream_of.get(id(p))
            if grad is not None and s is not None and grad.is_cuda:
                torch.cuda.current_stream(grad.device).wait_stream(s)
            return grad
        return hook

    def _weight_grad(self, layer, grad_y, x, weight, want_w: bool, want_b: bool) -> None:
        self._begin()
        if self._recording:
            self.backward_order.append(self.names[layer])
        if not (want_w or want_b):
            return
        params = [p for p, want in ((layer.weight, want_w), (layer.bias, want_b)) if want]
        if grad_y.device.type != "cuda":
            with self._span(f"weight-grad {self.names[layer]}", "weight-grad"):
                grads = _weight_grads(layer, grad_y, x, weight, want_w, want_b)
                self._accumulate(params, [g for g in grads if g is not None])
            return
        main = torch.cuda.current_stream(grad_y.device)
        side = self._side_stream(layer)
        side.wait_stream(main)                    # an event on the main stream, no host wait
        self._used_streams.add(side)
        self._mains.add(main)
        # Held to the end of the pass: with no other reference autograd would add the
        # next gradient into this very tensor in place, while the side stream reads it.
        self._held.append(grad_y)
        with torch.cuda.stream(side):
            start = self._gpu_event()
            grads = _weight_grads(layer, grad_y, x, weight, want_w, want_b)
            self._accumulate(params, [g for g in grads if g is not None])
            if start is not None:
                self._gpu_spans.append((f"weight-grad {self.names[layer]}", side, start, self._gpu_event()))
        for t in (grad_y, x, weight):
            t.record_stream(side)                 # the caching allocator must not reuse them early

    def _join_streams(self) -> None:
        """Order the current CUDA stream after every stream that produced gradients
        (before a bucket is flattened); nothing on the CPU."""
        if not self._streams:
            return
        current = torch.cuda.current_stream()
        for s in [*self._streams, *self._mains]:
            if s != current:
                current.wait_stream(s)

    def _accumulate(self, params, grads) -> None:
        for p, g in zip(params, grads):
            g = g.to(p.dtype)
            if p.grad is None:
                if g.stride() != p.stride():      # autograd's layout contract: .grad strides = param's
                    g = torch.empty_strided(p.shape, p.stride(), dtype=p.dtype, device=p.device).copy_(g)
                p.grad = g
            else:
                p.grad.add_(g)
            if self._reducer is not None:
                self._reducer.ready(p)

    def _accumulated(self, p: nn.Parameter) -> None:
        self._begin()
        self._reducer.ready(p)

    def _end(self) -> None:
        """End of the backward pass: join the side streams, reduce, record the trace."""
        self._task = None
        self._recording = False
        if self._used_streams:
            main = torch.cuda.current_stream()
            for s in self._used_streams:
                main.wait_stream(s)
            self._used_streams.clear()
            self._mains.clear()
        self._held.clear()
        if self._reducer is not None:
            with self._span("all-reduce wait", "comm"):
                self._reducer.finish()
        if self._gpu_spans:
            self.trace.cuda_spans(self._gpu_spans)
            self._gpu_spans = []

    def _gpu_event(self):
        if self.trace is None:
            return None
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def _span(self, name: str, cat: str):
        if self.trace is None:
            return contextlib.nullcontext()
        return self.trace.span(name, cat)
