"""``dlbooster predict``: the iteration time of data-parallel training and its bottleneck
(:mod:`dlbooster.predict`); ``predict calibrate`` measures a device profile,
``predict validate`` compares predictions with measured iterations (:mod:`dlbooster.bench.predict`)."""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from dataclasses import asdict
from pathlib import Path

from dlbooster.bench.common import machine, table
from dlbooster.support import argtypes
from dlbooster.support.files import json_target_problem, output_problem

# The planner, its validation and PyTorch are imported where they are used, so that
# `import dlbooster.cli` (every `dlbooster` run, --help too) does not load them.

__all__ = ["HELP", "DESCRIPTION", "add_arguments", "run"]

HELP = "predict data-parallel training iteration time and its bottleneck"
DESCRIPTION = ("Predict the iteration time of data-parallel CNN training from the model's per-layer work, a "
               "device profile, the network and the input pipeline, and name the limiting stage "
               "(host/predict/). 'predict calibrate' measures this machine's CPU (or GPU) profile; "
               "'predict validate' compares predictions with measured iterations.")


# The options each form of `predict` reads; one given to another form is refused rather
# than silently ignored.
_PREDICT_SCOPES = {
    None: ("model", "batch_size", "gpus", "nodes", "network", "decoder", "backward"),
    "calibrate": ("procs", "quick", "out"),
    "validate": ("models", "batch_sizes", "procs_list", "iterations", "rounds", "quiet"),
}


#: `predict`'s bounds (docs/predict.md): beyond them the recorded tensors' sizes leave
#: PyTorch's 64-bit integers (a traceback) long before any machine could run them.
_predict_batch = argtypes.integer_in(1, 1 << 20)         # images per device per iteration
_predict_image = argtypes.integer_in(1, 16384)           # square image side, pixels
_predict_gpus = argtypes.integer_in(1, 4096)             # ranks per node
_predict_nodes = argtypes.integer_in(1, 1 << 20)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", nargs="?", choices=("calibrate", "validate"))
    parser.add_argument("--model", default="resnet50", help="torchvision model")
    parser.add_argument("--batch-size", type=_predict_batch, default=32,
                        help="images per device per iteration (1 to 1048576)")
    parser.add_argument("--image-size", type=_predict_image,
                        help="square input side, pixels, 1 to 16384 (default 224; validate: 128)")
    parser.add_argument("--gpus", type=_predict_gpus, default=1,
                        help="data-parallel ranks per node, 1 to 4096 (processes on a CPU)")
    parser.add_argument("--nodes", type=_predict_nodes, default=1, help="nodes (1 to 1048576)")
    parser.add_argument("--device", default="cpu", help="profile: cpu (calibrated), cuda (calibrated GPU), a100, "
                                                        "v100, h100, t4, a calibrated name or a JSON file; "
                                                        "calibrate: cpu or cuda; validate: a GPU profile "
                                                        "is validated by training on the current GPU")
    parser.add_argument("--network", type=argtypes.positive_number, metavar="GBPS", help="inter-node bandwidth, Gbit/s")
    parser.add_argument("--decoder", metavar="LANESxMHZ|cpu:CORES", help="input pipeline per node")
    parser.add_argument("--backward", choices=("autograd", "split"), default="autograd")
    parser.add_argument("--json", nargs="?", const="-", metavar="FILE", help="print the result as JSON (or write FILE)")
    parser.add_argument("--procs", type=argtypes.positive, default=1, help="calibrate: processes timing at once")
    parser.add_argument("--quick", action="store_true",
                        help="calibrate: fewer, smaller kernels (a rough profile for tests: kernels beyond "
                             "its 0.2 GFLOP are priced at the best rate it measured)")
    parser.add_argument("--out", metavar="FILE", help="calibrate: where to write the profile")
    parser.add_argument("--models", default="resnet18,resnet50,mobilenet_v2,vgg11,densenet121,squeezenet1_1,"
                                             "googlenet,shufflenet_v2_x1_0", help="validate: models")
    parser.add_argument("--batch-sizes", default="8,16,32", help="validate: batch sizes (each 1 to 1048576)")
    parser.add_argument("--procs-list", default="1,2", help="validate: process counts")
    parser.add_argument("--iterations", type=argtypes.positive, default=5,
                        help="validate: timed iterations per configuration")
    parser.add_argument("--rounds", type=argtypes.positive, default=1,
                        help="validate: rounds over all configurations (measured: median of the rounds)")
    parser.add_argument("--quiet", action="store_true", help="validate: no progress lines")
    parser.set_defaults(predict_parser=parser)


def run(args: argparse.Namespace) -> int:
    """A prediction, ``calibrate`` or ``validate``, as ``args.action`` says: printed (or
    ``--json``); 0 when done, 1 when a result could not be written, 2 on bad usage or a
    refused model, profile or device."""
    from dlbooster.predict.calibration import calibrate
    from dlbooster.predict.profiles import load_profile, profile_dir
    from dlbooster.predict.model import parse_decoder, predict
    from dlbooster.predict.work import workload

    def dump(report) -> bool:
        """``--json`` alone: print the report as strict JSON (no NaN or Infinity) and nothing else."""
        if args.json == "-":
            print(json.dumps(report, indent=1, allow_nan=False))
            return True
        return False

    def write(report) -> str | None:
        """``--json FILE``: write the report as strict JSON; why it could not be, or None."""
        if args.json in (None, "-"):
            return None
        try:
            Path(args.json).write_text(json.dumps(report, indent=1, allow_nan=False) + "\n")
        except OSError as exc:
            return f"--json {args.json}: not written ({exc.strerror or exc})"
        except ValueError as exc:       # a number JSON cannot hold
            return f"--json {args.json}: not written ({exc})"
        return None

    if args.action is None and args.json in ("calibrate", "validate"):
        action = "'predict validate --json'" if args.json == "validate" else "'predict calibrate' (--out FILE)"
        print(f"dlbooster predict: --json took {args.json!r} as the file to write; for the action write "
              f"{action}, for a file of that name --json ./{args.json}", file=sys.stderr)
        return 2
    for action, dests in _PREDICT_SCOPES.items():
        given = [d for d in dests if getattr(args, d) != args.predict_parser.get_default(d)]
        if action != args.action and given:
            where = f"predict {action}" if action else "a prediction (no action)"
            print(f"dlbooster predict: --{given[0].replace('_', '-')} applies to {where} only", file=sys.stderr)
            return 2
    if args.action == "calibrate" and args.json is not None:
        print("dlbooster predict: calibrate writes a profile (--out FILE), not --json", file=sys.stderr)
        return 2
    if args.action == "calibrate" and args.image_size is not None:
        print("dlbooster predict: calibrate times kernels, not an image size: --image-size does not apply",
              file=sys.stderr)
        return 2
    image_size = args.image_size or (128 if args.action == "validate" else 224)
    problem = json_target_problem(args.json)        # before minutes of work, not after it
    if problem:
        print(f"dlbooster predict: {problem}", file=sys.stderr)
        return 2
    if args.action == "calibrate":
        if args.device not in ("cpu", "cuda"):
            print(f"dlbooster predict: calibrate measures --device cpu or cuda, not {args.device!r}",
                  file=sys.stderr)
            return 2
        # The profile's file, checked (its folder made) before minutes of calibration.
        out = args.out if args.out is not None else str(profile_dir() / (
            "cuda.json" if args.device == "cuda" else f"cpu-p{args.procs}.json"))
        label = "--out" if args.out is not None else "profile"
        try:
            if out and not Path(out).is_dir():
                Path(out).parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            why = "a file is in the way" if isinstance(exc, (FileExistsError, NotADirectoryError)) else exc.strerror
            print(f"dlbooster predict: {label} {out}: cannot make the folder {Path(out).parent} ({why or exc})",
                  file=sys.stderr)
            return 2
        problem = output_problem(out, label)
        if problem:
            print(f"dlbooster predict: {problem}", file=sys.stderr)
            return 2
        try:
            profile = calibrate(procs=args.procs, quick=args.quick, device=args.device)
        except (ValueError, RuntimeError) as err:
            print(f"dlbooster predict: {err}", file=sys.stderr)
            return 2
        try:
            path = profile.save(out)
        except OSError as exc:
            # Minutes of measurement: printed rather than lost.
            print(json.dumps(asdict(profile), indent=1))
            print(f"dlbooster predict: {label} {out}: not written ({exc.strerror or exc}); the profile is on "
                  f"stdout above: save it as a .json file and give that to --device", file=sys.stderr)
            return 1
        print(f"{path}: {profile.source}")
        return 0
    if args.action == "validate":
        from dlbooster.bench.predict import validate

        def show(r):
            print(f"{r['model']:>20} b{r['batch_size']:<4} x{r['procs']}  round {len(r['rounds_s'])}  "
                  f"measured {r['measured_s']:.3f} s  "
                  f"predicted {r['predicted_s']:.3f} s  error {r['error_pct']:.1f} %", file=sys.stderr)

        models = args.models.split(",")
        try:
            batches = [_predict_batch(b) for b in args.batch_sizes.split(",")]
            procs = [argtypes.positive(p) for p in args.procs_list.split(",")]
        except argparse.ArgumentTypeError as err:
            print(f"dlbooster predict: --batch-sizes and --procs-list are whole numbers above 0 separated by "
                  f"commas: {err}", file=sys.stderr)
            return 2
        if args.device != "cpu":
            import torch

            try:        # no such profile is said as such, GPU or not
                load_profile(args.device)
            except (FileNotFoundError, ValueError) as err:
                print(f"dlbooster predict: {err}", file=sys.stderr)
                return 2
            if not torch.cuda.is_available():       # found now, not after a minute of tracing
                print(f"dlbooster predict: validate --device {args.device} measures a CUDA GPU, and PyTorch finds "
                      f"none here; without --device it measures this machine's CPU", file=sys.stderr)
                return 2
        try:
            report = validate(models, batches, procs=procs, image_size=image_size,
                              iterations=args.iterations, rounds=args.rounds,
                              progress=None if args.quiet else show, device=args.device)
        except (FileNotFoundError, ValueError, RuntimeError) as err:
            print(f"dlbooster predict: {err}", file=sys.stderr)
            return 2
        report.update(machine(), date=datetime.date.today().isoformat(), command=" ".join(sys.argv))
        if dump(report):
            return 0
        failed = write(report)
        rows = [[r["model"], r["batch_size"], r["procs"], f"{r['measured_s']:.3f}", f"{r['predicted_s']:.3f}",
                 f"{r['error_pct']:.1f}"] for r in report["rows"]]
        print(table(["model", "batch", "procs", "measured s", "predicted s", "error %"], rows))
        print(f"mean absolute error {report['mean_error_pct']:.1f} %, worst {report['worst_error_pct']:.1f} % "
              f"over {len(rows)} configurations (goal: mean at most 10 %)")
        if failed:      # the measurements are in the table above
            print(f"dlbooster predict: {failed}", file=sys.stderr)
            return 1
        return 0
    if args.network is not None and args.nodes == 1:
        print("dlbooster predict: --network is the bandwidth between nodes; with one node (--nodes 1) it is "
              "not used", file=sys.stderr)
    try:
        profile = load_profile(args.device, procs=args.gpus)
        decoder = parse_decoder(args.decoder)
        # PyTorch steps SGD with its multi-tensor kernels on CUDA, one tensor at a time on a CPU.
        work = workload(args.model, args.batch_size, image_size=image_size, foreach=profile.kind == "gpu")
        result = predict(work, profile, gpus=args.gpus, nodes=args.nodes, network_gbps=args.network,
                         decoder=decoder, backward=args.backward)
    except (FileNotFoundError, ValueError) as err:
        print(f"dlbooster predict: {err}", file=sys.stderr)
        return 2
    except ImportError as err:
        print(f"dlbooster predict: {err}; install PyTorch: pip install -e '.[train]'", file=sys.stderr)
        return 2
    if dump(result):
        return 0
    failed = write(result)
    b = result["breakdown"]
    ms = lambda s: f"{1e3 * s:,.1f} ms"  # noqa: E731
    print(f"{args.model}, batch {args.batch_size} per device, {args.gpus} device(s) x {args.nodes} node(s), "
          f"{args.backward} backward; device {profile.name}: {profile.source}")
    print(f"iteration {ms(result['iteration_s'])}, {result['images_per_s']:,.0f} images/s; "
          f"bottleneck: {result['bottleneck']}")
    rows = [[k.replace("_", " "), ms(v)] for k, v in result["stages"].items()]
    rows += [[k.replace("_", " "), ms(b[k])] for k in ("forward", "input_gradient", "weight_gradient",
                                                        "backward_other", "optimizer", "allreduce",
                                                        "allreduce_exposed", "split_overhead", "page_faults")
             if k not in ("page_faults", "split_overhead") or b[k]]
    print(table(["stage", "time"], rows))
    # Fresh mappings cost page faults on a CPU; a GPU's caching allocator reuses its memory.
    fresh = (f", {b['fresh_bytes'] / 2**20:,.1f} MiB allocated afresh (page faults, counted in the stages "
             f"above)" if b["page_faults"] else "")
    print(f"work: {b['forward_gflop']:,.1f} GFLOP forward, {b['backward_gflop']:,.1f} GFLOP backward, "
          f"{b['gradient_bytes'] / 2**20:,.1f} MiB of gradients{fresh}")
    if failed:
        print(f"dlbooster predict: {failed}", file=sys.stderr)
        return 1
    return 0
