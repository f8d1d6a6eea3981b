"""Iteration-time predictor (host/predict/, `dlbooster predict`): the recorded work of real
torchvision models against their known sizes, the timing model's arithmetic on hand-made
work, calibration on this machine, and measured-vs-predicted on a small model. The
accuracy validation over 8 CNNs is `dlbooster predict validate`, recorded in
docs/benchmarks.md."""

from __future__ import annotations

import json
import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")

from dlbooster.cli import main  # noqa: E402
from dlbooster.predict.calibration import calibrate  # noqa: E402
from dlbooster.predict.model import BUCKET, FIRST_BUCKET, buckets, parse_decoder, predict  # noqa: E402
from dlbooster.predict.profiles import Profile, load_profile  # noqa: E402
from dlbooster.predict.work import Op, Workload, workload  # noqa: E402


def test_resnet18_work_matches_its_published_size():
    work = workload("resnet18", 2, image_size=224)
    # torchvision's ResNet-18: 11,689,512 parameters, 1.814 GMAC per 224x224 image.
    assert work.gradient_bytes == 4 * 11_689_512
    forward = work.flops("forward")
    assert forward == pytest.approx(2 * 2 * 1.8186e9, rel=0.01)
    # Backward: an input gradient and a weight gradient per layer, each as much as the
    # forward, except the stem convolution's input gradient (the image needs none).
    stem = next(o for o in work.ops if o.kind == "conv")
    assert work.flops("backward") == pytest.approx(2 * forward - stem.flops, rel=1e-9)
    assert sum(o.kind == "dgrad" for o in work.ops) == sum(o.kind == "conv" for o in work.ops) - 1
    # Every parameter's gradient is completed by exactly one backward operator.
    done = sorted(i for o in work.ops for i in o.grads)
    assert done == list(range(len(work.param_bytes)))
    assert all(o.phase == "backward" for o in work.ops if o.grads)
    assert {o.phase for o in work.ops} == {"forward", "backward", "optimizer"}


def test_depthwise_and_grouped_convolutions_are_classified():
    work = workload("mobilenet_v2", 1, image_size=64)
    classes = {o.conv_class for o in work.ops if o.kind == "conv"}
    assert classes == {"k1", "k3", "dw"}
    shuffle = workload("shufflenet_v2_x1_0", 1, image_size=64)
    assert "dw" in {o.conv_class for o in shuffle.ops if o.kind == "conv"}


def test_regnet_whose_builder_computes_with_tensors_is_recorded():
    work = workload("regnet_x_400mf", 2, image_size=64)
    # torchvision's RegNetX-400MF: 5,495,976 parameters; grouped 3x3 convolutions.
    assert work.gradient_bytes == 4 * 5_495_976
    assert "group" in {o.conv_class for o in work.ops if o.kind == "conv"}
    assert all(o.flops > 0 for o in work.ops if o.kind == "conv")


def test_unknown_model_is_rejected():
    with pytest.raises(ValueError, match="unknown torchvision classification model 'resnet_unknown'"):
        workload("resnet_unknown", 1)


def test_model_names_are_checked_as_train_checks_them(capsys):
    """torchvision.models' helpers (list_models, get_model) were called as builders (a
    TypeError traceback), and a segmentation model was said to be no torchvision model."""
    from dlbooster.predict.work import build_model

    for name in ("list_models", "get_model", "get_weight", "_utils"):
        with pytest.raises(ValueError) as exc:
            build_model(name)
        assert str(exc.value) == f"unknown torchvision classification model {name!r}"   # as `dlbooster train`
        assert main(["predict", "--device", "a100", "--model", name]) == 2
        assert capsys.readouterr().err == f"dlbooster predict: unknown torchvision classification model {name!r}\n"
    for name, kind in (("fcn_resnet50", "segmentation"), ("fasterrcnn_resnet50_fpn", "detection"),
                       ("r3d_18", "video"), ("quantized_resnet18", "quantized (int8)")):
        assert main(["predict", "--device", "a100", "--model", name]) == 2
        assert capsys.readouterr().err == (f"dlbooster predict: {name!r} is a torchvision {kind} model, "
                                           f"not a classification model\n")
    assert build_model("googlenet").aux1 is None        # still built as trained


def _profile(**changes):
    roof = {"roof": [0.0, 1e9, 1e12]}       # 1 GFLOP/s, bandwidth never binding
    base = dict(name="test", kind="gpu", source="hand-made", threads=1, procs=1,
                conv={f"{k}:k3": roof for k in ("conv", "dgrad", "wgrad")}, gemm=roof,
                memory={"*": [0.0, 1e9]}, view=0.0, allreduce=[0.0, 1e8], overlap=1.0,
                decode_per_core=100.0, host_us_per_image=100.0)
    base.update(changes)
    return Profile(**base)


def _work():
    """forward 1 s, backward: 2 s completing parameter 1 (8 MiB) then 1 s completing
    parameter 0 (4 MiB), optimizer 0.5 s (0.5 GB moved)."""
    ops = [Op("forward", "convolution", "conv", 1e9, 0, "k3"),
           Op("backward", "convolution_backward", "wgrad", 2e9, 0, "k3", [1]),
           Op("backward", "convolution_backward", "wgrad", 1e9, 0, "k3", [0]),
           Op("optimizer", "add_", "memory", 0, 5e8)]
    return Workload("hand", 16, 224, ops, [4 << 20, 8 << 20])


def test_single_device_time_is_the_sum_of_its_operators():
    result = predict(_work(), _profile(), gpus=1)
    assert result["iteration_s"] == pytest.approx(1 + 3 + 0.5)
    assert result["images_per_s"] == pytest.approx(16 / 4.5)
    assert result["bottleneck"] == "compute"
    assert result["breakdown"]["allreduce"] == 0


def test_ring_allreduce_overlaps_backward_as_buckets_fill():
    work = _work()
    # Parameter 1 (8 MiB) is ready at 3 s and fills the 1 MiB first bucket; parameter 0 at 4 s.
    assert buckets(work, {1: 3.0, 0: 4.0}) == [(3.0, 8 << 20), (4.0, 4 << 20)]
    result = predict(work, _profile(), gpus=2)
    first, second = (8 << 20) / 1e8, (4 << 20) / 1e8     # 2 (p-1)/p = 1 for two ranks
    # The first bucket runs from 3 s, hidden until the backward ends at 4 s.
    exposed = max(3.0 + first, 4.0) + second - 4.0
    assert result["breakdown"]["allreduce"] == pytest.approx(first + second)
    assert result["breakdown"]["allreduce_exposed"] == pytest.approx(exposed)
    assert result["iteration_s"] == pytest.approx(4.0 + exposed + 0.5)
    # With no overlap, the part under the backward is paid too.
    serial = predict(work, _profile(overlap=0.0), gpus=2)
    assert serial["breakdown"]["allreduce_exposed"] == pytest.approx(exposed + first)
    # Across nodes the network, if slower, sets the rate: 0.4 Gbit/s = 5e7 B/s.
    slow = predict(work, _profile(), gpus=1, nodes=2, network_gbps=0.4)
    assert slow["breakdown"]["allreduce"] == pytest.approx((12 << 20) / 5e7)


def test_bucket_sizes_follow_ddp():
    half = FIRST_BUCKET // 2
    work = Workload("w", 1, 1, [], [half] * 4 + [BUCKET] * 2)
    # Gradients ready in parameter order: the 1 MiB first bucket closes after two, later
    # buckets once they reach 25 MiB, the rest goes in a last one.
    assert buckets(work, {i: float(i) for i in range(6)}) == [
        (1.0, FIRST_BUCKET), (4.0, 2 * half + BUCKET), (5.0, BUCKET)]
    # DDP buckets in the order gradients became ready, not parameter order.
    assert buckets(work, {i: float(10 - i) for i in range(6)}) == [
        (5.0, BUCKET), (6.0, BUCKET), (10.0, 4 * half)]


def test_input_pipeline_can_be_the_bottleneck():
    from dlbooster.hw.build.synth import IMAGENET_CLOCKS

    work = _work()
    fpga = predict(work, _profile(), gpus=4, decoder=parse_decoder("1x250"))
    decode = 16 * 4 / (250e6 / IMAGENET_CLOCKS)
    assert fpga["stages"]["decode"] == pytest.approx(decode)
    assert fpga["stages"]["host"] == pytest.approx(16 * 100e-6)
    cpu = predict(work, _profile(), gpus=4, decoder=parse_decoder("cpu:2"))
    assert cpu["stages"]["decode"] == pytest.approx(64 / 200)
    assert cpu["bottleneck"] == "compute"
    starved = predict(work, _profile(decode_per_core=1.0), gpus=4, decoder=parse_decoder("cpu:2"))
    assert starved["bottleneck"] == "decode" and starved["iteration_s"] == pytest.approx(32.0)


def test_decoder_and_argument_errors():
    assert parse_decoder("4x250") == {"kind": "fpga", "lanes": 4, "mhz": 250.0}
    assert parse_decoder("cpu:16") == {"kind": "cpu", "cores": 16}
    with pytest.raises(ValueError):
        parse_decoder("fast")
    with pytest.raises(ValueError, match="network"):
        predict(_work(), _profile(), nodes=2)
    with pytest.raises(FileNotFoundError, match="calibrate"):
        load_profile("no-such-profile")
    # A CPU profile holds for as many ranks as shared the machine when it was measured.
    with pytest.raises(ValueError, match="calibrate --procs 4"):
        predict(_work(), _profile(kind="cpu", procs=2), gpus=4)
    # Counts and clocks of 0 divided by zero; negative ones gave negative times.
    for text in ("0x250", "8x0", "8x-250", "cpu:0", "cpu:-1", "x", "8x250x3", "cpu:"):
        with pytest.raises(ValueError, match=r"--decoder is LANESxMHZ \(e\.g\. 8x250\) or cpu:CORES"):
            parse_decoder(text)
    for kwargs, message in ((dict(gpus=-2), "gpus must be a whole number above 0"),
                            (dict(nodes=0), "nodes must be a whole number above 0"),
                            (dict(nodes=2, network_gbps=-5.0), "network_gbps must be a finite number above 0")):
        with pytest.raises(ValueError, match=message):
            predict(_work(), _profile(), **kwargs)
    with pytest.raises(TypeError, match="profile must be a Profile"):
        predict(_work(), "a100")


def test_profile_files_are_checked_and_named(tmp_path, capsys):
    """A profile file that was empty, not JSON, missing or adding a field, or held a
    negative rate gave a traceback, a message naming no file, or negative times."""
    from dataclasses import asdict

    good = json.loads(json.dumps(asdict(load_profile("a100"))))
    assert load_profile(str(_write(tmp_path / "good.json", good))).name == "a100"
    bad = {"empty.json": "", "list.json": [], "missing.json": {k: v for k, v in good.items() if k != "conv"},
           "extra.json": {**good, "extra": 1}, "view.json": {**good, "view": "fast"},
           "negative.json": {**good, "gemm": {"roof": [1e-5, -1e14, 1e12]}},
           "overlap.json": {**good, "overlap": 2.0}}
    reasons = {"empty.json": "not a readable device profile (Expecting value",
               "list.json": "not a device profile: a JSON object is needed, not list",
               "missing.json": "not a device profile: missing conv",
               "extra.json": "not a device profile: unknown field(s) extra",
               "view.json": "not a device profile: view must be a number, not 'fast'",
               "negative.json": "not a device profile: gemm.roof[1] is a rate and must be above 0",
               "overlap.json": "not a device profile: overlap is a share, 0 to 1"}
    for name, content in bad.items():
        path = _write(tmp_path / name, content)
        with pytest.raises(ValueError) as exc:
            load_profile(str(path))
        assert str(exc.value).startswith(f"{path}: {reasons[name]}"), str(exc.value)
    # A path without .json is a file, not a calibrated profile's name.
    (tmp_path / "noext").write_text(json.dumps(good))
    assert load_profile(str(tmp_path / "noext")).name == "a100"
    # The CLI: one line naming the file, exit 2; a missing cuda profile says how to make one.
    assert main(["predict", "--model", "resnet18", "--device", str(tmp_path / "negative.json")]) == 2
    assert capsys.readouterr().err.startswith(f"dlbooster predict: {tmp_path / 'negative.json'}: not a device profile")
    with pytest.raises(FileNotFoundError, match="calibrate --device cuda"):
        load_profile("cuda")


def _write(path, content):
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def test_cli_refuses_bad_predict_input_before_working(tmp_path, capsys):
    """Each of these gave a traceback, a negative time, or failed only after the work."""
    cases = [(["--model", "inception_v3", "--batch-size", "2", "--image-size", "32", "--device", "a100"],
              "dlbooster predict: inception_v3 does not run on 32x32-pixel images ("),
             (["--device", "a100", "--json", str(tmp_path / "nodir" / "r.json")],
              f"dlbooster predict: --json {tmp_path / 'nodir' / 'r.json'}: no such folder"),
             (["validate", "--batch-sizes", "0,abc"],
              "dlbooster predict: --batch-sizes and --procs-list are whole numbers above 0"),
             (["--device", "a100", "--decoder", "0x250"], "dlbooster predict: --decoder is LANESxMHZ")]
    if not torch.cuda.is_available():
        cases.append((["validate", "--device", "a100"],
                      "dlbooster predict: validate --device a100 measures a CUDA GPU, and PyTorch finds none"))
    for argv, message in cases:
        assert main(["predict", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith(message), (argv, err)
    # Options of another form of the command are refused, not silently ignored.
    for argv, message in ((["--device", "a100", "--procs", "2"], "--procs applies to predict calibrate only"),
                          (["--device", "a100", "--rounds", "3"], "--rounds applies to predict validate only"),
                          (["calibrate", "--gpus", "4"], "--gpus applies to a prediction (no action) only"),
                          (["validate", "--backward", "split"], "--backward applies to a prediction"),
                          (["validate", "--out", "p.json"], "--out applies to predict calibrate only"),
                          (["calibrate", "--json"], "calibrate writes a profile (--out FILE), not --json"),
                          (["calibrate", "--image-size", "64"], "calibrate times kernels, not an image size"),
                          (["--json", "validate"], "--json took 'validate' as the file to write; for the action "
                                                   "write 'predict validate --json', for a file of that name "
                                                   "--json ./validate"),
                          (["--json", "calibrate"], "--json took 'calibrate' as the file to write; for the "
                                                    "action write 'predict calibrate' (--out FILE), for a file "
                                                    "of that name --json ./calibrate")):
        assert main(["predict", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith(f"dlbooster predict: {message}") and err.count("\n") == 1, (argv, err)
    with pytest.raises(SystemExit) as exc:
        main(["predict", "--device", "a100", "--nodes", "2", "--network", "-5"])
    assert exc.value.code == 2
    assert "argument --network: must be a finite number above 0, not -5" in capsys.readouterr().err


def test_split_backward_adds_its_measured_cpu_overhead():
    cpu = _profile(kind="cpu", procs=1)
    plain = predict(_work(), cpu)["iteration_s"]
    split = predict(_work(), cpu, backward="split")
    assert split["iteration_s"] == pytest.approx(plain * 1.012)
    # The overhead is a row of its own: the compute stage is its parts added up.
    b = split["breakdown"]
    assert b["split_overhead"] == pytest.approx(plain * 0.012)
    parts = ("forward", "input_gradient", "weight_gradient", "backward_other", "optimizer", "allreduce_exposed",
             "split_overhead")
    assert sum(b[k] for k in parts) == pytest.approx(split["stages"]["compute"], rel=1e-12)
    assert predict(_work(), cpu)["breakdown"]["split_overhead"] == 0.0
    # Not modelled as faster or slower on a GPU (not measured there).
    assert predict(_work(), _profile(), backward="split")["iteration_s"] == pytest.approx(plain)
    with pytest.raises(ValueError):
        predict(_work(), cpu, backward="fast")


def test_memory_tables_interpolate_in_log_log():
    from dlbooster.predict.profiles import memory_time

    table = [[1e3, 1e5, 1e7], [1e-6, 1e-5, 1e-3]]
    assert memory_time(table, 10) == 1e-6                       # below: the smallest time
    assert memory_time(table, 1e4) == pytest.approx(math.sqrt(1e-6 * 1e-5))
    assert memory_time(table, 1e6) == pytest.approx(1e-4)
    assert memory_time(table, 4e7) == pytest.approx(4e-3)       # above: bandwidth bound
    assert memory_time([2e-6, 1e9], 1e6) == pytest.approx(2e-6 + 1e-3)


def test_outputs_of_32_mib_and_more_are_fresh_allocations():
    from dlbooster.predict.work import FRESH_LIMIT

    work = workload("vgg11", 8, image_size=64)
    fresh = [o for o in work.ops if o.fresh]
    assert all(o.fresh >= FRESH_LIMIT and o.kind != "view" and not o.name.endswith("_") for o in fresh)
    # The first classifier layer's weight gradient (4096 x 25088 fp32, 392 MiB) is a
    # fresh allocation of the backward, and its weight-decay sum one of the optimizer.
    classifier = 4096 * 25088 * 4
    assert any(o.phase == "backward" and o.kind == "gemm" and o.fresh == classifier for o in fresh)
    assert any(o.phase == "optimizer" and o.fresh == classifier for o in fresh)
    assert work.fresh_bytes == sum(o.fresh for o in fresh)
    # Small tensors come from the heap: nothing fresh.
    assert workload("resnet18", 1, image_size=64).fresh_bytes == 0


def test_convolutions_count_their_working_copies_as_fresh():
    """oneDNN reorders a convolution's activations into a channel-blocked layout through
    temporaries of the same size: at batch 32 and 128x128 VGG-11's first convolution
    (6 MiB in, 128 MiB out) allocates its output and a copy of it afresh."""
    work = workload("vgg11", 32, image_size=128)
    first = next(o for o in work.ops if o.kind == "conv")
    out = 32 * 64 * 128 * 128 * 4
    assert first.fresh == 2 * out
    # Its weight gradient (the image needs no input gradient) copies the output gradient.
    wgrad = [o for o in work.ops if o.kind == "wgrad"][-1]
    assert wgrad.dims == first.dims and wgrad.fresh == out
    # The second convolution (128 MiB in after pooling: 32 MiB; 64 MiB out): output,
    # input copy and output copy; its input gradient: the gradient, its copy and the
    # output gradient's copy.
    second = [o for o in work.ops if o.kind == "conv"][1]
    assert second.fresh == (64 + 32 + 64) << 20
    dgrad = next(o for o in work.ops if o.kind == "dgrad" and o.dims == second.dims)
    assert dgrad.fresh == (32 + 32 + 64) << 20


def test_recorded_fresh_bytes_match_the_page_faults_of_real_convolutions():
    """The fresh bytes recorded for a convolution's forward, input gradient and weight
    gradient equal the page faults the real CPU kernels take (counted in a process of
    its own with getrusage; a 32 MiB input, a 32 MiB output)."""
    import subprocess
    import sys

    code = (
        "import resource, torch\n"
        "from torch.utils._python_dispatch import TorchDispatchMode\n"
        "from dlbooster.predict.work import record_op\n"
        "torch.set_num_threads(1)\n"
        "rows = []\n"
        "class Count(TorchDispatchMode):\n"
        "    def __torch_dispatch__(self, func, types, args=(), kwargs=None):\n"
        "        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
        "        out = func(*args, **(kwargs or {}))\n"
        "        faulted = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) * resource.getpagesize()\n"
        "        if func.overloadpacket.__name__.startswith('convolution'):\n"
        "            rec = record_op(func, args, kwargs or {}, out, 'x')\n"
        "            rows.append((sum(o.fresh for o in (rec if isinstance(rec, list) else [rec])), faulted))\n"
        "        return out\n"
        "x = torch.randn(8, 64, 128, 128, requires_grad=True)\n"
        "w = torch.randn(64, 64, 3, 3, requires_grad=True)\n"
        "g = torch.randn(8, 64, 128, 128)\n"
        "for _ in range(2):\n"
        "    rows.clear()\n"
        "    with Count():\n"
        "        torch.nn.functional.conv2d(x, w, None, 1, 1).backward(g)\n"
        "print(*(f'{r}:{f}' for r, f in rows))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    rows = [tuple(map(int, pair.split(":"))) for pair in out.stdout.split()]
    mib = 1 << 20
    # Forward: output, input copy, output copy; backward (both gradients): the input
    # gradient, its copy and the output gradient's copy, then the input's and the output
    # gradient's copies.
    assert [r for r, _ in rows] == [96 * mib, 160 * mib]
    for recorded, faulted in rows:
        assert 0.9 * recorded <= faulted <= 1.1 * recorded, (recorded, faulted)


def test_fitted_costs_never_beat_their_measured_peak():
    from dlbooster.predict.calibration import fit_dims
    from dlbooster.predict.profiles import op_cost

    # Times that grow as (M N K)^0.6: the fit extrapolates to ever higher rates.
    samples = [([m, 64, 64], 1e6, 1e-9 * (m * 64 * 64) ** 0.6) for m in (64, 256, 1024, 4096)]
    spec = fit_dims(samples)
    assert spec["peak"] == pytest.approx(max(2 * m * 64 * 64 / t for (m, *_), _, t in samples))
    small = Op("forward", "mm", "gemm", 2.0 * 256 * 64 * 64, 1e6, dims=[256, 64, 64])
    assert op_cost(spec, small) == pytest.approx(1e-9 * (256 * 64 * 64) ** 0.6, rel=1e-6)
    huge = Op("forward", "mm", "gemm", 2.0 * 2**24 * 64 * 64, 1e6, dims=[2**24, 64, 64])
    assert op_cost(spec, huge) == pytest.approx(huge.flops / spec["peak"])
    # Profiles fitted before the peak was kept are not capped.
    uncapped = {"dims": spec["dims"]}
    assert op_cost(uncapped, huge) < op_cost(spec, huge) / 10


def test_page_faults_are_charged_per_fresh_byte():
    work = _work()
    work.ops[0].fresh = 2e9
    cpu = _profile(kind="cpu", fault=2.5e-10)
    plain = predict(_work(), cpu)
    faulted = predict(work, cpu)
    assert faulted["iteration_s"] == pytest.approx(plain["iteration_s"] + 0.5)
    assert faulted["breakdown"]["forward"] == pytest.approx(plain["breakdown"]["forward"] + 0.5)
    assert faulted["breakdown"]["page_faults"] == pytest.approx(0.5)
    assert faulted["breakdown"]["fresh_bytes"] == 2e9
    # Profiles saved before the cost was measured charge nothing for it.
    assert Profile(**{k: v for k, v in cpu.__dict__.items() if k != "fault"}).fault == 0


def test_step_factor_scales_every_operator_but_not_the_page_faults():
    work = _work()
    work.ops[0].fresh = 2e9
    plain = predict(work, _profile(kind="cpu", fault=2.5e-10))
    scaled = predict(work, _profile(kind="cpu", fault=2.5e-10, step_factor=1.2))
    assert plain["iteration_s"] == pytest.approx(4.5 + 0.5)
    assert scaled["iteration_s"] == pytest.approx(1.2 * 4.5 + 0.5)
    assert scaled["breakdown"]["optimizer"] == pytest.approx(1.2 * 0.5)
    # Profiles saved before the factor was measured scale nothing.
    assert Profile(**{k: v for k, v in _profile().__dict__.items() if k != "step_factor"}).step_factor == 1


def test_step_factor_is_the_geometric_mean_of_measured_over_priced_steps():
    """Against the real recorded reference models: a model measured at twice its priced
    step and one at half give 1; both at 1.3x give 1.3."""
    from dlbooster.predict.calibration import step_factor
    from dlbooster.predict.profiles import kernel_time
    from dlbooster.predict.work import REFERENCE_MODELS

    profile = _profile(kind="cpu", fault=1e-9, conv={f"{k}:{c}": {"roof": [1e-6, 1e10, 1e11]}
                                                     for k in ("conv", "dgrad", "wgrad")
                                                     for c in ("k1", "k3", "kn", "dw", "group")})
    a, b = sorted(REFERENCE_MODELS)[:2]
    priced = {m: sum(kernel_time(profile, op) for op in workload(m, 2, image_size=64).ops) for m in (a, b)}
    assert all(t > 0 for t in priced.values())
    assert step_factor(profile, {a: [2, 64, 2 * priced[a]], b: [2, 64, priced[b] / 2]}) == pytest.approx(1.0)
    assert step_factor(profile, {a: [2, 64, 1.3 * priced[a]], b: [2, 64, 1.3 * priced[b]]}) == pytest.approx(1.3)
    assert step_factor(profile, {}) == 1.0
    # Several processes: the modelled all-reduce comes off the measured step first.
    pair = _profile(**{**profile.__dict__, "procs": 2})
    comm = {m: predict(workload(m, 2, image_size=64), pair, gpus=2)["iteration_s"] - priced[m] for m in (a, b)}
    assert min(comm.values()) > 0
    assert step_factor(pair, {m: [2, 64, 1.3 * priced[m] + comm[m]] for m in (a, b)}) == pytest.approx(1.3)
    # Held out from the models `dlbooster predict validate` measures by default.
    from dlbooster.cli import parser

    validated = parser().parse_args(["predict", "validate"]).models.split(",")
    assert len(validated) == 8 and set(REFERENCE_MODELS).isdisjoint(validated)


def test_calibration_allocator_keeps_freed_memory():
    """The calibration's allocator setting removes the page faults of re-allocating a
    large block (measured in a process of its own: the setting lasts for the process)."""
    import subprocess
    import sys

    code = (
        "import resource, torch\n"
        "from dlbooster.predict.calibration import _keep_freed_memory\n"
        "def faults():\n"
        "    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
        "    for _ in range(5):\n"
        "        torch.empty(16 << 20).fill_(1.0)\n"
        "    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before\n"
        "default = faults()\n"
        "assert _keep_freed_memory()\n"
        "faults()\n"
        "print(default, faults())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    default, kept = map(int, out.stdout.split())
    # 64 MiB in 4 KiB pages: about 16,384 faults per allocation by default.
    assert default > 5 * 10_000 and kept < default / 10


def test_fault_cost_is_not_charged_where_kernels_include_it(monkeypatch):
    """Where the C library cannot keep freed memory, the kernels' timings include their
    page faults: the profile then charges none (not twice)."""
    import dlbooster.predict.calibration as P

    monkeypatch.setattr(P, "_time_kernels", lambda *args: {})
    for kept, charged in ((False, False), (True, True)):
        monkeypatch.setattr(P, "_keep_freed_memory", lambda kept=kept: kept)
        assert (P.calibrate_kernels(1)["fault"] > 0) == charged


def test_gpu_optimizer_is_recorded_as_multi_tensor_kernels():
    loop = workload("resnet18", 2, image_size=64)
    fused = workload("resnet18", 2, image_size=64, foreach=True)
    def kernels(w):
        return [o.name for o in w.ops if o.phase == "optimizer" and o.kind != "view"]

    assert len(kernels(fused)) < 20 < len(kernels(loop))
    assert set(kernels(fused)) <= {"_foreach_add_", "_foreach_mul_", "_foreach_add", "_foreach_mul"}
    # The same bytes move either way.
    moved = lambda w: sum(o.bytes for o in w.ops if o.phase == "optimizer")  # noqa: E731
    assert moved(fused) == pytest.approx(moved(loop), rel=0.01)


def test_cli_predicts_with_a_shipped_gpu_profile(capsys):
    assert main(["predict", "--model", "resnet50", "--batch-size", "64", "--gpus", "8", "--device", "a100",
                 "--decoder", "4x250", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["device_source"].startswith("public peak figures")
    assert result["images_per_s"] == pytest.approx(64 * 8 / result["iteration_s"])
    assert result["bottleneck"] == max(result["stages"], key=result["stages"].get)
    # ResNet-50: 25.6 M parameters, about 4.1 GMAC per image.
    assert result["breakdown"]["gradient_bytes"] == 4 * 25_557_032
    assert result["breakdown"]["forward_gflop"] == pytest.approx(64 * 2 * 4.09, rel=0.02)


def test_cli_prints_the_breakdown(capsys):
    assert main(["predict", "--model", "resnet18", "--batch-size", "32", "--gpus", "4", "--nodes", "2",
                 "--network", "25", "--device", "v100", "--decoder", "cpu:8"]) == 0
    out = capsys.readouterr().out
    assert "bottleneck:" in out and "allreduce exposed" in out and "decode" in out
    # A GPU's caching allocator takes no page faults: no such row, no "allocated afresh".
    assert "page faults" not in out and "afresh" not in out and "MiB of gradients\n" in out
    assert main(["predict", "--model", "resnet18", "--nodes", "2", "--device", "v100"]) == 2
    capsys.readouterr()
    # A network bandwidth on one node changes nothing, and says so.
    assert main(["predict", "--model", "resnet18", "--network", "25", "--device", "v100"]) == 0
    printed = capsys.readouterr()
    assert printed.err == ("dlbooster predict: --network is the bandwidth between nodes; with one node "
                           "(--nodes 1) it is not used\n")
    assert main(["predict", "--model", "resnet18", "--device", "v100"]) == 0
    assert capsys.readouterr().out == printed.out


def test_cli_without_a_calibrated_profile_says_how(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DLBOOSTER_CACHE", str(tmp_path))
    assert main(["predict", "--model", "resnet18", "--device", "cpu"]) == 2
    assert "dlbooster predict calibrate" in capsys.readouterr().err


def test_calibrated_profile_predicts_a_measured_iteration(tmp_path, monkeypatch):
    from dlbooster.bench.predict import validate

    monkeypatch.setenv("DLBOOSTER_CACHE", str(tmp_path))
    # One thread: validate measures with the profile's thread count, and a one-thread
    # kernel beside another busy process slows by at most its share of a core, where a
    # two-thread kernel on a 2-core machine can stall whole barriers (a 6x outlier in CI).
    profile = calibrate(quick=True, threads=1)
    assert profile.procs == 1 and profile.threads == 1 and profile.source.startswith("measured")
    assert set(profile.conv) == {f"{k}:{c}" for k in ("conv", "dgrad", "wgrad")
                                 for c in ("k1", "k3", "kn", "dw", "group")}
    for sizes, times in profile.memory.values():
        assert sizes == sorted(sizes) and len(sizes) == len(times) and min(times) > 0
    # Memory-bound kernels cost more with more bytes, past the cache at least.
    assert profile.memory["add"][1][-1] > profile.memory["add"][1][0]
    assert profile.decode_per_core > 10
    # Page faults: about 0.1-2 ms per MiB written afresh.
    assert 1e-11 < profile.fault < 1e-8
    profile.save(tmp_path / "profiles" / "cpu-p1.json")
    assert load_profile("cpu", procs=1) == profile
    report = validate(["squeezenet1_1"], [4], procs=(1,), image_size=64, iterations=3, warmup=1, rounds=2)
    (row,) = report["rows"]
    assert len(row["rounds_s"]) == 2 and row["measured_s"] == pytest.approx(sum(row["rounds_s"]) / 2)
    assert row["measured_s"] > 0 and row["predicted_s"] > 0
    assert row["error_pct"] == pytest.approx(100 * abs(row["predicted_s"] - row["measured_s"]) / row["measured_s"])
    # The prediction is the profile's, for this model (how close it comes to the
    # measurement is a benchmark: `dlbooster predict validate`, docs/benchmarks.md).
    assert row["predicted_s"] == predict(workload("squeezenet1_1", 4, image_size=64), profile)["iteration_s"]
    assert math.isfinite(report["mean_error_pct"])


def test_a_profile_without_an_allreduce_predicts_one_device_only():
    single = _profile(allreduce=[0.0, float("inf")])
    assert predict(_work(), single, gpus=1)["iteration_s"] == pytest.approx(4.5)
    with pytest.raises(ValueError, match="no all-reduce"):
        predict(_work(), single, gpus=2)
    # Across nodes the network bounds the ring.
    assert predict(_work(), single, gpus=1, nodes=2, network_gbps=8)["breakdown"]["allreduce"] > 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_gpu_calibration_without_cuda_is_refused(capsys):
    with pytest.raises(RuntimeError, match="no CUDA device"):
        calibrate(device="cuda")
    with pytest.raises(ValueError, match="one process"):
        calibrate(device="cuda", procs=2)
    assert main(["predict", "calibrate", "--device", "cuda"]) == 2
    assert "no CUDA device" in capsys.readouterr().err
    assert main(["predict", "calibrate", "--device", "h100"]) == 2
    assert "cpu or cuda" in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_calibrated_profile_predicts_a_measured_gpu_iteration(tmp_path, monkeypatch):
    from dlbooster.bench.predict import validate

    monkeypatch.setenv("DLBOOSTER_CACHE", str(tmp_path))
    profile = calibrate(device="cuda", quick=True)
    assert profile.kind == "gpu" and profile.fault == 0 and torch.cuda.get_device_name() in profile.source
    profile.save(tmp_path / "profiles" / "cuda.json")
    report = validate(["resnet18"], [16], image_size=64, iterations=5, warmup=2, device="cuda")
    (row,) = report["rows"]
    assert row["procs"] == 1 and row["measured_s"] > 0
    assert row["predicted_s"] == predict(workload("resnet18", 16, image_size=64), profile)["iteration_s"]


def test_two_process_calibration_measures_the_allreduce():
    profile = calibrate(procs=2, quick=True)
    latency, rate = profile.allreduce
    assert profile.procs == 2 and profile.threads >= 1
    # Local gloo: tens of microseconds to a millisecond per step, 0.1-100 GB/s.
    assert 1e-6 < latency < 0.01 and 1e8 < rate < 1e11


def test_rescoring_a_saved_validation_prices_its_measurements_with_other_profiles(tmp_path, capsys):
    """scripts/predict_rescore.py: each row's error against the profile of its process
    count, nothing measured again."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[3] / "scripts" / "predict_rescore.py"
    spec = importlib.util.spec_from_file_location("predict_rescore", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    work = workload("squeezenet1_1", 2, image_size=64)
    p1, p2 = _profile(kind="cpu"), _profile(kind="cpu", procs=2, overlap=0.0)
    one, two = predict(work, p1, gpus=1)["iteration_s"], predict(work, p2, gpus=2)["iteration_s"]
    validation = {"image_size": 64, "rows": [
        {"model": "squeezenet1_1", "batch_size": 2, "procs": 1, "measured_s": one / 0.8},   # 20 % under
        {"model": "squeezenet1_1", "batch_size": 2, "procs": 2, "measured_s": two / 1.5}]}  # 50 % over
    score = script.rescore(validation, p1, p2)
    assert score["mean_error_pct_1"] == pytest.approx(20.0)
    assert score["mean_error_pct_2"] == pytest.approx(50.0)
    assert score["mean_error_pct"] == pytest.approx(35.0) and score["worst_error_pct"] == pytest.approx(50.0)
    files = []
    for name, profile in (("p1", p1), ("p2", p2)):
        files.append(tmp_path / f"{name}.json")
        profile.save(files[-1])
    (tmp_path / "v.json").write_text(json.dumps(validation))
    assert script.main([str(tmp_path / "v.json"), *map(str, files), "--json", str(tmp_path / "out.json")]) == 0
    assert "35.0" in capsys.readouterr().out
    assert json.loads((tmp_path / "out.json").read_text())["results"][0]["mean_error_pct"] == pytest.approx(35.0)


def _table_ms(out: str) -> dict:
    """The CLI table's rows: ``{stage: milliseconds}``."""
    rows = {}
    for line in out.splitlines():
        name, _, value = line.strip().rpartition("  ")
        if value.endswith(" ms") and name:
            rows[name.strip()] = float(value[:-3].replace(",", ""))
    return rows


def test_cli_table_adds_up_with_the_split_overhead(tmp_path, capsys):
    """On a CPU profile with --backward split, the compute row held the split schedule's
    overhead (1.2 %) but no row showed it: the rows did not add up."""
    from dataclasses import asdict

    _profile(kind="cpu").save(tmp_path / "cpu.json")
    argv = ["predict", "--model", "resnet18", "--batch-size", "4", "--image-size", "64",
            "--device", str(tmp_path / "cpu.json")]
    assert main([*argv, "--backward", "split"]) == 0
    rows = _table_ms(capsys.readouterr().out)
    parts = ("forward", "input gradient", "weight gradient", "backward other", "optimizer", "allreduce exposed",
             "split overhead")
    assert rows["split overhead"] == pytest.approx(rows["compute"] * 0.012 / 1.012, abs=0.1)
    assert sum(rows[k] for k in parts) == pytest.approx(rows["compute"], abs=0.1 * len(parts))
    # No overhead, no row.
    assert main(argv) == 0
    assert "split overhead" not in capsys.readouterr().out
    assert asdict(_profile(kind="cpu"))     # the file came from a Profile


@pytest.mark.parametrize("target, message", [
    ("{tmp}", "--json {tmp}: a folder; give a file name"),
    ("", "--json: an empty path; give a file name"),
    ("{tmp}/afile/x.json", "--json {tmp}/afile/x.json: no such folder {tmp}/afile"),
    pytest.param("/proc/self/x.json", "--json /proc/self/x.json: No such file or directory",
                 marks=pytest.mark.skipif(not __import__("os").path.isdir("/proc/self"), reason="needs /proc")),
])
def test_cli_refuses_an_unusable_json_target_before_working(tmp_path, monkeypatch, capsys, target, message):
    """--json naming a folder, a path that cannot be made or an empty path gave a
    traceback after the work (the empty one: nothing written, exit 0)."""
    import dlbooster.bench.predict
    import dlbooster.predict.calibration
    import dlbooster.predict.work

    (tmp_path / "afile").write_text("")
    target, message = target.format(tmp=tmp_path), message.format(tmp=tmp_path)
    for module, name in ((dlbooster.predict.work, "workload"), (dlbooster.bench.predict, "validate")):
        monkeypatch.setattr(module, name, lambda *a, **k: pytest.fail("worked before the refusal"))
    for argv in (["--device", "a100"], ["validate"]):
        assert main(["predict", *argv, "--json", target]) == 2
        out, err = capsys.readouterr()
        assert err == f"dlbooster predict: {message}\n" and not out, (argv, err)


def test_cli_calibrate_refuses_an_unusable_out_before_measuring(tmp_path, monkeypatch, capsys):
    """calibrate --out naming a folder ran for minutes, then crashed and lost the profile."""
    import dlbooster.predict.calibration

    monkeypatch.setattr(dlbooster.predict.calibration, "calibrate", lambda **k: pytest.fail("calibrated before the refusal"))
    (tmp_path / "afile").write_text("")
    for target, message in ((str(tmp_path), f"--out {tmp_path}: a folder; give a file name"),
                            ("", "--out: an empty path; give a file name"),
                            (str(tmp_path / "afile" / "p.json"),
                             f"--out {tmp_path / 'afile' / 'p.json'}: cannot make the folder {tmp_path / 'afile'} "
                             f"(a file is in the way)")):
        assert main(["predict", "calibrate", "--quick", "--out", target]) == 2
        assert capsys.readouterr().err == f"dlbooster predict: {message}\n", target
    # The default place, too: the cache folder.
    (tmp_path / "cache").write_text("")
    monkeypatch.setenv("DLBOOSTER_CACHE", str(tmp_path / "cache"))
    assert main(["predict", "calibrate", "--quick"]) == 2
    assert capsys.readouterr().err.startswith(f"dlbooster predict: profile {tmp_path / 'cache'}/profiles/cpu-p1.json: "
                                              f"cannot make the folder")
    # A missing folder is still made for the profile, as before.
    monkeypatch.setattr(dlbooster.predict.calibration, "calibrate", lambda **k: _profile(kind="cpu"))
    assert main(["predict", "calibrate", "--quick", "--out", str(tmp_path / "new" / "p.json")]) == 0
    assert load_profile(str(tmp_path / "new" / "p.json")) == _profile(kind="cpu")


@pytest.mark.skipif(not __import__("os").path.exists("/dev/full"), reason="needs /dev/full")
def test_a_write_that_fails_at_the_end_is_one_line_and_loses_nothing(monkeypatch, capsys):
    """/dev/full can be opened but not written: a traceback after the work (ENOSPC)."""
    import dlbooster.bench.predict
    import dlbooster.predict.calibration
    from dlbooster.predict.profiles import profile_from_json

    assert main(["predict", "--device", "a100", "--model", "resnet18", "--json", "/dev/full"]) == 1
    out, err = capsys.readouterr()
    assert err == "dlbooster predict: --json /dev/full: not written (No space left on device)\n"
    assert "iteration" in out and "bottleneck" in out          # the prediction is still shown
    row = {"model": "resnet18", "batch_size": 8, "procs": 1, "rounds_s": [0.5], "measured_s": 0.5,
           "predicted_s": 0.6, "error_pct": 20.0}
    report = {"rows": [row], "mean_error_pct": 20.0, "worst_error_pct": 20.0}
    monkeypatch.setattr(dlbooster.bench.predict, "validate", lambda *a, **k: dict(report))
    assert main(["predict", "validate", "--quiet", "--json", "/dev/full"]) == 1
    out, err = capsys.readouterr()
    assert err == "dlbooster predict: --json /dev/full: not written (No space left on device)\n"
    assert "0.500" in out and "0.600" in out and "20.0" in out   # the measurements are not lost
    # calibrate: the measured profile is printed rather than lost.
    profile = _profile(kind="cpu")
    monkeypatch.setattr(dlbooster.predict.calibration, "calibrate", lambda **k: profile)
    assert main(["predict", "calibrate", "--out", "/dev/full"]) == 1
    out, err = capsys.readouterr()
    assert profile_from_json(json.loads(out)) == profile
    assert err.startswith("dlbooster predict: --out /dev/full: not written (No space left on device); the profile "
                          "is on stdout") and err.count("\n") == 1


def test_cli_refuses_sizes_beyond_its_bounds(capsys):
    """A batch size or image size beyond 64-bit integers gave a TypeError traceback."""
    for option, value, most in (("--batch-size", "9" * 26, 1 << 20), ("--image-size", str(2**63), 16384),
                                ("--gpus", str(10**400), 4096), ("--nodes", str(2**64), 1 << 20)):
        with pytest.raises(SystemExit) as exc:
            main(["predict", "--device", "a100", option, value])
        assert exc.value.code == 2
        assert f"argument {option}: must be at most {most}, not {value}" in capsys.readouterr().err
    assert main(["predict", "validate", "--batch-sizes", f"8,{(1 << 20) + 1}"]) == 2
    assert "must be at most 1048576" in capsys.readouterr().err
    # The maxima themselves predict, with finite numbers.
    work = workload("resnet18", 1 << 20, image_size=16384)
    result = predict(work, load_profile("a100"), gpus=4096, nodes=1 << 20, network_gbps=100)
    assert math.isfinite(result["iteration_s"]) and math.isfinite(result["images_per_s"])


def test_profiles_with_non_finite_or_absurd_figures_are_refused(tmp_path, capsys):
    """A profile with "step_factor": Infinity or "view": 1e308 predicted `iteration inf ms`
    and --json wrote Infinity (not JSON)."""
    from dataclasses import asdict

    good = json.loads(json.dumps(asdict(load_profile("a100"))))
    for change, reason in (({"step_factor": float("inf")}, "step_factor must be from 0.01 to 100, not inf"),
                           ({"step_factor": 1e-300}, "step_factor must be from 0.01 to 100"),
                           ({"view": 1e308}, "view must be finite, at least 0 and at most 3600 seconds, not 1e+308"),
                           ({"gemm": {"roof": [0.0, 1e-300, 1e12]}}, "gemm.roof[1] is a rate per second, from 0.001"),
                           ({"gemm": {"roof": [0.0, float("inf"), 1e12]}}, "gemm.roof[1] is a rate per second"),
                           ({"memory": {"*": [[1e3, 1e6], [1e-6, float("inf")]]}},
                            "memory['*'] seconds[1] must be finite"),
                           ({"fault": 1e300}, "fault must be finite, at least 0 and at most 1 seconds per byte"),
                           ({"host_us_per_image": float("inf")}, "host_us_per_image must be finite"),
                           ({"gemm": {"dims": [1e300, 0, 0, 0, 0]}}, "gemm.dims[0] must be finite and within +-100")):
        path = _write(tmp_path / "bad.json", {**good, **change})
        with pytest.raises(ValueError) as exc:
            load_profile(str(path))
        assert str(exc.value).startswith(f"{path}: not a device profile: {reason}"), str(exc.value)
        out = tmp_path / "out.json"
        assert main(["predict", "--model", "resnet18", "--device", str(path), "--json", str(out)]) == 2
        assert capsys.readouterr().err.startswith(f"dlbooster predict: {path}: not a device profile: {reason}")
        assert not out.exists()
    # An infinite all-reduce rate still means one process's (free), as calibrations write it.
    assert load_profile(str(_write(tmp_path / "one.json", {**good, "allreduce": [0.0, float("inf")]}))).name == "a100"
    # Figures within the bounds that still overflow a float are refused by predict().
    path = _write(tmp_path / "huge.json", {**good, "gemm": {"dims": [100, 100, 100, 100, 100]}})
    assert main(["predict", "--model", "resnet18", "--device", str(path)]) == 2
    assert capsys.readouterr().err.startswith("dlbooster predict: profile 'a100' prices resnet18 at batch 32 and "
                                              "224x224 beyond a floating-point number")
    # What --json writes is strict JSON.
    out = tmp_path / "out.json"
    assert main(["predict", "--model", "resnet18", "--device", "a100", "--json", str(out)]) == 0
    json.loads(out.read_text(), parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))


def test_validate_names_a_missing_profile_before_looking_for_a_gpu(tmp_path, monkeypatch, capsys):
    """validate --device nosuch.json said that it measures a CUDA GPU, and PyTorch finds
    none, rather than that there is no such profile."""
    monkeypatch.setenv("DLBOOSTER_CACHE", str(tmp_path))
    for name, path in (("nosuch.json", "nosuch.json"), ("nosuch", tmp_path / "profiles" / "nosuch.json")):
        assert main(["predict", "validate", "--device", name]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"dlbooster predict: no device profile {name!r} ({path}); run `dlbooster predict "
                              f"calibrate") and err.count("\n") == 1, err
    _write(tmp_path / "broken.json", "{")
    assert main(["predict", "validate", "--device", str(tmp_path / "broken.json")]) == 2
    assert "not a readable device profile" in capsys.readouterr().err
