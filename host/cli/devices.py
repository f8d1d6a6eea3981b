"""``dlbooster devices``: the decoder boards PYNQ or XRT find on this machine."""

from __future__ import annotations

import argparse

# The boards (Amaranth) are imported where they are used, so that `import dlbooster.cli`
# (every `dlbooster` run, --help too) does not load them.

__all__ = ["HELP", "DESCRIPTION", "add_arguments", "run"]

HELP = "list the decoder boards PYNQ or XRT find"
DESCRIPTION = ("List the boards PYNQ (pynq.Device.devices) or XRT (pyxrt) find on this machine, one line each: "
               "driver, index, name. Exit 1 when there are none, with the reason each driver gives (not "
               "installed, or no card).")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``devices`` takes no arguments."""


def run(args: argparse.Namespace) -> int:
    """Print the boards found: 0 when there are some, 1 (with each driver's reason) when none."""
    from dlbooster.device.boards import find_boards

    problems: list[str] = []
    boards = find_boards(problems)
    for b in boards:
        print(f"{b['driver']:5} {b['index']:3}  {b['name']}")
    if boards:
        return 0
    # Say why: a driver that is not installed (or not sourced) looks like no card.
    print("no decoder boards found (PYNQ: pynq.Device.devices; Alveo: XRT's pyxrt)")
    for problem in problems:
        print(f"  {problem}")
    return 1
