"""SplitBackward: gradients equal to plain autograd's, alone and under DDP (2 gloo ranks)."""

from __future__ import annotations

import copy
import json

import pytest

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")

from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from dlbooster.train.schedule import SplitBackward, split_layers  # noqa: E402
from dlbooster.train.trace import Trace  # noqa: E402


def _grads(model):
    return {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}


def _step(model, x, y, seed=1):
    torch.manual_seed(seed)                      # the same dropout masks in both runs
    F.cross_entropy(model(x), y).backward()


def _compare(model, x, y, *, autocast=False, **options):
    reference = copy.deepcopy(model)
    split = copy.deepcopy(model)
    scheduler = SplitBackward(split, **options)
    for m in (reference, split):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            _step(m, x, y)
    a, b = _grads(reference), _grads(split)
    assert a.keys() == b.keys()
    for name in a:
        assert (a[name] is None) == (b[name] is None), name
        if a[name] is not None:
            assert torch.equal(a[name], b[name]), f"{name}: max diff {(a[name] - b[name]).abs().max()}"
    return scheduler


@pytest.mark.parametrize("name", ["resnet18", "resnet50", "densenet121", "googlenet"])
def test_torchvision_models_bitwise(name):
    torch.manual_seed(0)
    extra = {"aux_logits": False, "init_weights": True} if name == "googlenet" else {}
    model = torchvision.models.__dict__[name](num_classes=5, **extra)
    x, y = torch.randn(2, 3, 64, 64), torch.tensor([1, 4])
    scheduler = _compare(model, x, y)
    n_split = sum(isinstance(m, (nn.Conv2d, nn.Linear)) for m in model.modules())
    assert len(scheduler.layers) == n_split
    # Autograd's dependency order: the classifier first, the stem convolution last.
    assert scheduler.backward_order[0] in ("fc", "classifier")
    assert scheduler.backward_order[-1] in ("conv1", "features.conv0", "conv1.conv")
    assert len(scheduler.backward_order) == n_split


def test_autocast_bf16_bitwise():
    torch.manual_seed(0)
    _compare(torchvision.models.resnet18(num_classes=3), torch.randn(2, 3, 32, 32),
             torch.tensor([0, 2]), autocast=True)


class _Shared(nn.Module):
    """One convolution and one linear layer each used twice, a frozen layer, a
    bias-free convolution, a Conv1d, batch norm and a branch that is summed back."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.frozen = nn.Conv2d(8, 8, 1)
        self.frozen.requires_grad_(False)
        self.shared = nn.Conv2d(8, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.seq = nn.Conv1d(8, 8, 3, stride=2, padding=1)
        self.head = nn.Linear(8, 8)
        self.out = nn.Linear(8, 4)

    def forward(self, x):
        x = F.relu(self.bn(self.stem(x)))
        x = self.frozen(x)
        x = self.shared(F.relu(self.shared(x))) + x
        x = self.seq(x.flatten(2)).mean(2)
        return self.out(self.head(F.relu(self.head(x))))


def test_shared_frozen_and_branches():
    torch.manual_seed(0)
    model = _Shared()
    scheduler = _compare(model, torch.randn(3, 3, 12, 12), torch.tensor([0, 3, 1]))
    assert model.frozen.weight.grad is None
    assert {n for n, _ in split_layers(model)} == {"stem", "frozen", "shared", "seq", "head", "out"}
    # Shared layers run their backward once per use.
    assert scheduler.backward_order.count("shared") == 2
    assert scheduler.backward_order.count("head") == 2


def test_unbatched_and_one_dimensional_inputs():
    torch.manual_seed(0)
    conv, lin = nn.Conv2d(3, 4, 3), nn.Linear(16, 3)
    model = nn.Sequential(conv, nn.Flatten(0), nn.Linear(4 * 4 * 4, 16), nn.ReLU(), lin)
    x = torch.randn(3, 6, 6, requires_grad=True)          # no batch dimension
    reference = copy.deepcopy(model)
    SplitBackward(model)
    xr = x.detach().clone().requires_grad_()
    reference(xr).sum().backward()
    model(x).sum().backward()
    assert torch.equal(x.grad, xr.grad)
    for a, b in zip(reference.parameters(), model.parameters()):
        assert torch.equal(a.grad, b.grad)


class _Tied(nn.Module):
    """An embedding whose weight is also the (split) output layer's: autograd and the
    split layer both contribute to one gradient."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.out = nn.Linear(4, 10, bias=False)
        self.out.weight = self.emb.weight

    def forward(self, t):
        return self.out(self.emb(t).relu())


def test_tied_weights_through_the_reducer(tmp_path):
    """One-rank process group: the reducer's bucket for a tied weight waits for
    autograd's contribution too, in every iteration (not only the first)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        reference = _Tied()
        split = copy.deepcopy(reference)
        SplitBackward(split, process_group=dist.group.WORLD, bucket_mb=1e-6)   # a bucket per parameter
        t = torch.tensor([1, 2, 3])
        for _ in range(3):
            for m in (reference, split):
                m.zero_grad(set_to_none=True)
                F.cross_entropy(m(t), t).backward()
            assert torch.equal(reference.out.weight.grad, split.out.weight.grad)
    finally:
        dist.destroy_process_group()


def test_failed_backward_does_not_stall_the_next(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
        reference = copy.deepcopy(model)
        SplitBackward(model, process_group=dist.group.WORLD)
        x, y = torch.randn(3, 4), torch.tensor([0, 1, 1])
        F.cross_entropy(model(x), y).backward()               # plans the buckets

        def fail(grad):
            raise RuntimeError("injected")
        hidden = model[0](x)
        hidden.register_hook(fail)
        with pytest.raises(RuntimeError, match="injected"):
            F.cross_entropy(model[2](model[1](hidden)), y).backward()
        for m in (reference, model):
            m.zero_grad(set_to_none=True)
            F.cross_entropy(m(x), y).backward()
        for a, b in zip(reference.parameters(), model.parameters()):
            assert torch.equal(a.grad, b.grad)
    finally:
        dist.destroy_process_group()


def test_autograd_grad_leaves_parameters_alone():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(16, 2))
    SplitBackward(model)
    x = torch.randn(2, 3, 4, 4, requires_grad=True)
    (gx,) = torch.autograd.grad(model(x).sum(), x)
    assert gx.shape == x.shape
    assert all(p.grad is None for p in model.parameters())
    model(x).sum().backward(inputs=[model[2].weight])
    assert model[2].weight.grad is not None
    assert model[0].weight.grad is None and model[2].bias.grad is None


def test_gradient_layout_follows_the_parameter():
    torch.manual_seed(0)
    model = nn.Conv2d(3, 4, 3)
    reference = copy.deepcopy(model)
    SplitBackward(model)
    x = torch.randn(2, 3, 6, 6).contiguous(memory_format=torch.channels_last)
    for m in (reference, model):
        m(x).sum().backward()
    assert model.weight.grad.stride() == reference.weight.grad.stride() == model.weight.stride()
    assert torch.equal(model.weight.grad, reference.weight.grad)


def test_subclass_with_its_own_forward_is_not_split():
    class Scaled(nn.Linear):
        def forward(self, x):
            return 2 * super().forward(x)

    model = nn.Sequential(Scaled(3, 3), nn.Linear(3, 1))
    assert [n for n, _ in split_layers(model)] == ["1"]


def test_unsplit_layers_keep_autograd():
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding="same"), nn.Conv2d(4, 4, 3, padding=1, padding_mode="reflect"),
                          nn.Conv2d(4, 4, 3, padding=1), nn.Flatten(), nn.LazyLinear(2))
    model(torch.randn(1, 3, 6, 6))
    assert [n for n, _ in split_layers(model)] == ["2", "4"]
    _compare(model, torch.randn(2, 3, 6, 6), torch.tensor([0, 1]))


def test_trace_and_remove():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 2))
    trace = Trace()
    scheduler = SplitBackward(model, trace=trace)
    _step(model, torch.randn(2, 3, 6, 6), torch.tensor([0, 1]))
    spans = [e for e in trace.to_json()["traceEvents"] if e["ph"] == "X"]
    names = [e["name"] for e in spans]
    # Input gradient first, then the weight gradient, layer by layer from the top; the
    # first layer's input needs no gradient, so it has no input-gradient task.
    assert names == ["input-grad 3", "weight-grad 3", "weight-grad 0"]
    assert all(e["dur"] >= 0 for e in spans)
    scheduler.remove()
    assert "forward" not in model[0].__dict__
    model.zero_grad()
    _step(model, torch.randn(2, 3, 6, 6), torch.tensor([0, 1]))
    assert len([e for e in trace.events if e["ph"] == "X"]) == 3     # nothing new recorded


def _ddp_worker(rank: int, world: int, store: str, out: str, bucket_mb: float) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    torch.manual_seed(0)
    base = torchvision.models.resnet18(num_classes=4)
    if rank == 1:                                # SplitBackward must broadcast rank 0's weights
        with torch.no_grad():
            for p in base.parameters():
                p.add_(1.0)
    ddp = DDP(copy.deepcopy(base))
    split = copy.deepcopy(base)
    scheduler = SplitBackward(split, bucket_mb=bucket_mb)
    gen = torch.Generator().manual_seed(100 + rank)
    result = {"equal": [], "buckets": 0}
    for _ in range(3):                           # iteration 1 plans the buckets, 2-3 use them
        x = torch.randn(2, 3, 32, 32, generator=gen)
        y = torch.randint(0, 4, (2,), generator=gen)
        for m in (ddp, split):
            m.zero_grad(set_to_none=True)
            F.cross_entropy(m(x), y).backward()
        same = all(torch.equal(a.grad, b.grad) for a, b in zip(ddp.module.parameters(), split.parameters()))
        result["equal"].append(same)
        with torch.no_grad():                    # the same SGD step on both
            for a, b in zip(ddp.module.parameters(), split.parameters()):
                a.sub_(0.1 * a.grad)
                b.sub_(0.1 * b.grad)
    result["buckets"] = len(scheduler._reducer.buckets)
    result["buffers_equal"] = all(torch.equal(a, b) for a, b in zip(ddp.module.buffers(), split.buffers()))
    with open(out, "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


def test_ddp_two_gloo_processes(tmp_path):
    import torch.multiprocessing as mp

    outs = [str(tmp_path / f"rank{r}.json") for r in range(2)]
    store = str(tmp_path / "store")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_ddp_worker, args=(r, 2, store, outs[r], 2.0)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
        assert p.exitcode == 0
    for out in outs:
        with open(out) as f:
            result = json.load(f)
        assert result["equal"] == [True, True, True]
        assert result["buckets"] > 1             # several buckets, launched during backward
        assert result["buffers_equal"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_streams_match_autograd():
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=5).cuda()
    x, y = torch.randn(4, 3, 64, 64, device="cuda"), torch.tensor([1, 4, 0, 2], device="cuda")
    reference, split = copy.deepcopy(model), copy.deepcopy(model)
    trace = Trace()
    SplitBackward(split, streams=2, trace=trace)
    for m in (reference, split):
        _step(m, x, y)
    for (name, a), b in zip(reference.named_parameters(), split.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6, msg=name)
    streams = {e["tid"] for e in trace.events if e.get("cat") == "cuda"}
    assert len(streams) == 2



def test_autograd_grad_of_split_weights_equals_autograd():
    """torch.autograd.grad naming a split layer's weight and bias gets them back (the
    engine captures them from the layer's node, so the split layer must return them),
    equal to plain autograd's, and leaves every .grad alone."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(16, 2), nn.LayerNorm(2))
    reference = copy.deepcopy(model)
    SplitBackward(model)
    x = torch.randn(2, 3, 4, 4, requires_grad=True)
    for m in (reference, model):
        wanted = [x, m[0].weight, m[3].bias, m[4].weight]
        got = torch.autograd.grad(m(x).square().sum(), wanted)
        if m is reference:
            expect = got
    assert all(torch.equal(a, b) for a, b in zip(expect, got))
    assert all(p.grad is None for p in model.parameters())
    unbatched = nn.Conv1d(2, 3, 3)
    ref_w = torch.autograd.grad(unbatched(torch.ones(2, 5)).sum(), unbatched.weight)[0]
    SplitBackward(unbatched)
    assert torch.equal(torch.autograd.grad(unbatched(torch.ones(2, 5)).sum(), unbatched.weight)[0], ref_w)


def test_computed_weights_are_not_split_and_get_their_gradients():
    """weight_norm and parametrizations compute a layer's weight from other parameters;
    a split layer would keep those parameters from their gradients (weight_norm's g and v
    got None), so such layers keep autograd's backward."""
    def make():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 2))
        with pytest.warns(FutureWarning):
            torch.nn.utils.weight_norm(model[0])
        torch.nn.utils.parametrizations.weight_norm(model[2])
        return model

    reference, model = make(), make()
    SplitBackward(model)
    assert [n for n, _ in split_layers(model)] == ["4"]
    x, y = torch.randn(5, 4), torch.tensor([0, 1, 1, 0, 1])
    for m in (reference, model):
        _step(m, x, y)
    a, b = _grads(reference), _grads(model)
    assert a.keys() == b.keys() and {"0.weight_g", "0.weight_v", "2.parametrizations.weight.original0"} <= a.keys()
    for name in a:
        assert a[name] is not None and torch.equal(a[name], b[name]), name


def test_a_copy_of_a_split_model_is_a_plain_model():
    """copy.deepcopy after installing (an EMA or teacher model) computes with the copy's
    own weights, and torch.save of the whole module loads as plain layers."""
    import io

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    SplitBackward(model)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for p in twin.parameters():
            p.zero_()
    x = torch.randn(2, 4)
    assert torch.equal(twin(x), torch.zeros(2, 2))
    assert not torch.equal(model(x), torch.zeros(2, 2))
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert torch.equal(loaded(x), model(x))
    loaded(x).sum().backward()
    assert loaded[0].weight.grad is not None


def test_a_tied_weight_hook_ignores_the_split_layers_none():
    """Autograd calls a parameter's tensor hooks with None for a split layer's
    contribution. The scheduler's own hook orders autograd's add after the parameter's
    side stream on CUDA; it must let None through (it read ``None.is_cuda`` on CUDA,
    failing every backward pass). A stand-in stream marks the weight as served by one."""
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    reference = copy.deepcopy(model)
    scheduler = SplitBackward(model)
    scheduler._stream_of[id(model.weight)] = object()
    x = torch.randn(3, 4)
    for m in (reference, model):
        m(x).sum().backward()
    assert torch.equal(model.weight.grad, reference.weight.grad)


def test_bad_arguments_and_lazy_layers():
    model = nn.Sequential(nn.Linear(3, 2))
    for bad, error in [({"streams": 0}, ValueError), ({"streams": 2.5}, TypeError), ({"streams": "2"}, TypeError),
                       ({"bucket_mb": "x"}, ValueError), ({"bucket_mb": 0}, ValueError),
                       ({"bucket_mb": float("inf")}, ValueError)]:
        with pytest.raises(error):
            SplitBackward(model, **bad)
    with pytest.raises(TypeError, match="nn.Module"):
        SplitBackward(None)
    with pytest.raises(ValueError, match="forward pass"):
        SplitBackward(nn.Sequential(nn.LazyLinear(2)))
    assert "forward" not in model[0].__dict__ and not model[0].weight._backward_hooks


def test_a_failed_install_leaves_no_hooks():
    model = nn.Sequential(nn.Linear(3, 2))
    with pytest.raises(Exception):
        SplitBackward(model, process_group=object())
    assert not model[0].weight._backward_hooks and not model[0].bias._backward_hooks
    assert "forward" not in model[0].__dict__


def test_an_instance_forward_is_not_split():
    model = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 2))
    own = model[0].forward = lambda x: 3 * x[..., :2]
    scheduler = SplitBackward(model)
    assert [n for n, _ in scheduler.layers] == ["1"]
    scheduler.remove()
    assert model[0].forward is own
