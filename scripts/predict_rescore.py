"""Score a saved predictor validation again with other device profiles.

    python scripts/predict_rescore.py VALIDATION.json P1.json P2.json [P1.json P2.json ...]

``VALIDATION.json`` is the output of ``dlbooster predict validate --json``; each pair of
profile files (``dlbooster predict calibrate`` and ``calibrate --procs 2`` output, as kept
under ``~/.cache/dlbooster/profiles/``) prices its 1- and 2-process rows with the current
predictor code, against the iteration times the validation measured. Nothing is measured
again, so the comparison separates what the model and a profile contribute to the error
from the machine's drift between runs. Prints, per profile pair, the mean and worst
absolute percentage error (1 and 2 processes apart); ``--json FILE`` writes them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from dlbooster.predict.model import predict
from dlbooster.predict.profiles import Profile
from dlbooster.predict.work import workload


def rescore(validation: dict, p1: Profile, p2: Profile) -> dict:
    """Mean and worst absolute percentage error of ``validation``'s measured times
    against predictions with ``p1`` (1-process rows) and ``p2`` (2-process rows)."""
    works: dict = {}
    errors: dict = {1: [], 2: []}
    for row in validation["rows"]:
        key = (row["model"], row["batch_size"])
        if key not in works:
            works[key] = workload(row["model"], row["batch_size"], image_size=validation["image_size"])
        profile = p1 if row["procs"] == 1 else p2
        predicted = predict(works[key], profile, gpus=row["procs"])["iteration_s"]
        errors[row["procs"]].append(100 * abs(predicted - row["measured_s"]) / row["measured_s"])
    every = errors[1] + errors[2]
    return {"mean_error_pct": statistics.mean(every), "worst_error_pct": max(every),
            "mean_error_pct_1": statistics.mean(errors[1]) if errors[1] else None,
            "mean_error_pct_2": statistics.mean(errors[2]) if errors[2] else None}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("validation", type=Path)
    parser.add_argument("profiles", type=Path, nargs="+",
                        help="pairs: 1-process profile, 2-process profile")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if len(args.profiles) % 2:
        parser.error("profiles come in pairs (1 process, 2 processes)")
    validation = json.loads(args.validation.read_text())
    results = []
    print(f"{'1-process profile':32s} {'2-process profile':32s} {'mean %':>7s} {'x1 %':>6s} {'x2 %':>6s} {'worst %':>8s}")
    for a, b in zip(args.profiles[::2], args.profiles[1::2]):
        p1, p2 = (Profile(**json.loads(path.read_text())) for path in (a, b))
        score = rescore(validation, p1, p2)
        results.append({"profiles": [str(a), str(b)], **score})
        x1, x2 = score["mean_error_pct_1"], score["mean_error_pct_2"]
        print(f"{a.name:32s} {b.name:32s} {score['mean_error_pct']:7.1f} "
              f"{x1 if x1 is not None else float('nan'):6.1f} {x2 if x2 is not None else float('nan'):6.1f} "
              f"{score['worst_error_pct']:8.1f}")
    if args.json:
        args.json.write_text(json.dumps({"validation": str(args.validation), "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
