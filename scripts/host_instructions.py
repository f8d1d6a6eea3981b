"""Instructions per image of the runtime's host path, counted by callgrind.

    python scripts/host_instructions.py [--epochs 5] [--no-pixels] [--json FILE]

The wall-clock host cost (``dlbooster bench host``) moves with the machine's load; the
instructions the process executes do not, so two versions of the runtime compare
exactly. The ``bench host`` set-up (the ImageNet sample photos of the shared corpus
through ``Loader`` and ``DecodeService`` to the instant device: 4 lanes, batch 64,
1-megapixel slots) runs under ``valgrind --tool=callgrind`` with collection off; after
the warm-up epoch this script switches it on (``callgrind_control -i on``), and off
again after ``--epochs`` timed epochs, before the interpreter's exit. Counted: every
thread; reported: instructions per image, in all and less ``memcpy`` and ``crc32`` (the
instrument's pixel writes and content keys, which a device's DMA would do). ``--no-pixels``
runs the control instrument of ``dlbooster bench host``'s control epochs: the same host
path, no pixel writes.

Needs valgrind (``callgrind_control``, ``callgrind_annotate``) and the corpus
(``DLBOOSTER_CORPUS`` or ../shared/corpus). Takes a few minutes (decoding the photos
once under valgrind, for the instrument's outputs).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def child(epochs: int, marks: Path, pixels: bool) -> None:
    """Under valgrind: warm up, mark, run the epochs, mark, wait to be switched off."""
    from dlbooster.cli.bench import inputs
    from dlbooster.bench.runtime import host_loader

    loader, _ = host_loader(inputs(argparse.Namespace(paths=[], limit=0, kind="host")),   # as `bench host` does
                            pixels=pixels)
    loader.set_epoch(0)
    sum(len(batch[1]) for batch in loader)
    (marks / "warm").write_text(str(os.getpid()))
    while not (marks / "on").exists():
        time.sleep(0.1)
    images = 0
    for epoch in range(1, epochs + 1):
        loader.set_epoch(epoch)
        images += sum(len(batch[1]) for batch in loader)
    (marks / "done").write_text(str(images))
    while not (marks / "off").exists():
        time.sleep(0.1)
    loader.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--no-pixels", dest="pixels", action="store_false",
                        help="the control instrument: no pixel writes (as in bench host's control epochs)")
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--child", metavar="MARKS", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.epochs, Path(args.child), args.pixels)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        marks, out = Path(tmp), Path(tmp) / "callgrind.out"
        proc = subprocess.Popen(["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
                                 sys.executable, __file__, "--epochs", str(args.epochs), "--child", tmp,
                                 *([] if args.pixels else ["--no-pixels"])])
        for mark, then in (("warm", "on"), ("done", "off")):
            while not (marks / mark).exists():
                if proc.poll() is not None:
                    raise SystemExit(f"the run under valgrind ended early (exit {proc.returncode})")
                time.sleep(0.5)
            pid = (marks / "warm").read_text()
            subprocess.run(["callgrind_control", "-i", then, pid], check=True, capture_output=True)
            (marks / then).write_text("")
        images = int((marks / "done").read_text())
        proc.wait()
        text = subprocess.run(["callgrind_annotate", "--inclusive=no", str(out)], capture_output=True, text=True,
                              check=True).stdout
    total = int(re.search(r"([\d,]+) \(100\.0%\)\s+PROGRAM TOTALS", text).group(1).replace(",", ""))
    left_out = sum(int(m.group(1).replace(",", "")) for m in
                   re.finditer(r"^\s*([\d,]+) \([\d. ]+%\)\s+\S*?(?:memmove|memcpy|crc32)", text, re.M))
    result = {"images": images, "epochs": args.epochs, "pixels": args.pixels, "instructions_per_image": total / images,
              "less_memcpy_crc32_per_image": (total - left_out) / images}
    print(f"{images} images: {result['instructions_per_image']:,.0f} instructions per image, "
          f"{result['less_memcpy_crc32_per_image']:,.0f} less memcpy and crc32")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
