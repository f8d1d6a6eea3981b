"""``dlbooster demo``: every packaged photograph through the reference model, checked
against Pillow."""

from __future__ import annotations

import argparse
import sys
import tempfile

from dlbooster.cli import decode
from dlbooster.jpeg import DEFAULT_MAX_WIDTH
from dlbooster.support import argtypes
from dlbooster.support.samples import encode_variants, packaged_photos

__all__ = ["HELP", "DESCRIPTION", "add_arguments", "run"]

HELP = "decode real photographs through the model, checked against Pillow"
#: None: ``demo --help`` shows the usage and options alone.
DESCRIPTION = None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-width", type=argtypes.max_width, default=DEFAULT_MAX_WIDTH)


def run(args: argparse.Namespace) -> int:
    """Encode the packaged photographs as JPEG variants and decode them as ``dlbooster decode
    --backend model --verify`` does: its exit status, or 1 when there are no photographs."""
    photos = packaged_photos()
    if not photos:
        print("no packaged photographs found: install scikit-image", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        encode_variants(tmp, photos)
        print(f"Encoded {len(photos)} real photographs from scikit-image into JPEG variants "
              f"(4:4:4, 4:2:2, 4:2:0, gray, restart markers, optimised tables);")
        print("decoding them through the reference model of the decoder lane and checking "
              "every pixel against Pillow:\n")
        # Parsed as the decode command's own arguments, so every decode option has its default.
        options = argparse.ArgumentParser(prog="dlbooster decode")
        decode.add_arguments(options)
        return decode.run(options.parse_args(["--backend", "model", "--max-width", str(args.max_width),
                                              "--verify", tmp]))
