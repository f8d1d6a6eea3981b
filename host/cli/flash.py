"""``dlbooster flash --board BOARD BINARY``: load a bitstream or xclbin on a board through
PYNQ or XRT and self-test it against the CPU path."""

from __future__ import annotations

import argparse
import io
import sys

from dlbooster.backends import CpuBackend
from dlbooster.jpeg import parse
from dlbooster.support.samples import load_photo, packaged_photos

# The boards (Amaranth) and Pillow are imported where they are used, so that `import
# dlbooster.cli` (every `dlbooster` run, --help too) does not load them.

__all__ = ["HELP", "DESCRIPTION", "add_arguments", "run"]

HELP = "load a bitstream or xclbin on a board and self-test it"
DESCRIPTION = ("Load BINARY (a .bit with its .hwh beside it, or an .xclbin) on the board through PYNQ or XRT, "
               "then decode a photograph on it and compare with the CPU path. Exit 0 when equal.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from dlbooster.hw.build.boards import BOARDS

    parser.add_argument("--board", required=True, choices=sorted(BOARDS))
    parser.add_argument("binary", metavar="BITSTREAM_OR_XCLBIN")


def _self_test_jpeg(max_width: int) -> bytes:
    """A real photograph (scikit-image's, else a Pillow-drawn test card) as a 4:2:0
    JPEG at most ``max_width`` pixels wide."""
    from PIL import Image

    photos = packaged_photos()
    if photos:
        image = Image.fromarray(load_photo(photos[0]))
    else:
        image = Image.radial_gradient("L").convert("RGB")
    width = min(image.width, max_width, 256)
    image = image.crop((0, 0, width, min(image.height, 192)))
    out = io.BytesIO()
    image.save(out, "JPEG", quality=90, subsampling=2)
    return out.getvalue()


def run(args: argparse.Namespace) -> int:
    """Load ``args.binary`` on ``args.board`` and decode a photograph on it: 0 when it equals
    the CPU path's decode, 1 when it differs or the board cannot be opened."""
    from dlbooster.device.boards import BoardError, open_board

    try:
        device = open_board(args.board, args.binary)
    except BoardError as exc:
        print(f"dlbooster flash: {exc}", file=sys.stderr)
        return 1
    print(f"{args.binary} loaded on {args.board} ({device.transport.name}): {device.lanes} lane(s), "
          f"{device.max_width}-pixel line buffers, {8 * device.bus_bytes}-bit memory bus")
    data = _self_test_jpeg(device.max_width)
    frame = parse(data).frame
    outcome = device.decode_batch([(data, frame.width * frame.height * 3)])[0]
    done = outcome.completion
    expected = CpuBackend().decode(data)
    same = outcome.image is not None and outcome.image.shape == expected.shape and (outcome.image == expected).all()
    print(f"self-test: {frame.width}x{frame.height} JPEG, status 0x{done.status:02x}, {done.clocks} clocks, "
          f"{'equal to' if same else 'DIFFERENT from'} the CPU path")
    return 0 if same else 1
