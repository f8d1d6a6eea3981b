"""The ``dlbooster`` command line.

This module only dispatches: the top-level options, the commands, and how a run ends
(Ctrl-C, SIGTERM, a closed pipe). Each command is a module of this package, which holds
its help (``HELP``, and ``DESCRIPTION`` for its own ``--help``), declares its arguments
(``add_arguments(parser)``) and runs (``run(args)``, the exit status).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys

from dlbooster import __version__
from dlbooster.cli import bench, build, debug_lane, decode, demo, devices, flash, predict, records, synth, train
from dlbooster.runtime.sampler import dist_env

# The simulators' build cache (dlbooster.sim.flow) is imported once the command line is
# parsed, so that `dlbooster --help` does not load it.

__all__ = ["main", "parser"]

#: The commands, in the order ``dlbooster --help`` lists them, and their modules.
_COMMANDS = (("decode", decode), ("build", build), ("bench", bench), ("debug-lane", debug_lane),
             ("synth", synth), ("predict", predict), ("flash", flash), ("devices", devices),
             ("train", train), ("records", records), ("demo", demo))


def parser() -> argparse.ArgumentParser:
    """The command line's parser: the top-level options and every command's arguments."""
    top = argparse.ArgumentParser(prog="dlbooster", description=__doc__.split("\n")[0])
    top.add_argument("-v", "--verbose", action="store_true", help="log backend choices")
    top.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = top.add_subparsers(dest="command", required=True)
    for name, command in _COMMANDS:
        p = sub.add_parser(name, help=command.HELP, description=command.DESCRIPTION)
        command.add_arguments(p)
        p.set_defaults(func=command.run)
    return top


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C's KeyboardInterrupt would be (see :func:`_sigterm_as_interrupt`)."""


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """Within the block, SIGTERM (``kill``, a batch system's time limit) unwinds the main
    thread as Ctrl-C does, so the cleanup that Ctrl-C runs runs too; :func:`main` then
    exits with 143. Only where the main thread waits in Python: a command blocked in a
    collective would not see it, so ``train`` under torchrun keeps the default (the
    process ends).
    A second SIGTERM while the first unwinds is ignored (SIGKILL still ends the
    process); the cleanups also hold signals off (:func:`dlbooster.records.pcr.signals_held`)."""
    def terminate(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise _Terminated

    if signal.getsignal(signal.SIGTERM) is signal.SIG_IGN:   # ignored by whoever started us: keep it so
        yield
        return
    try:
        previous = signal.signal(signal.SIGTERM, terminate)
    except ValueError:                     # not the main thread: leave SIGTERM alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _distributed() -> bool:
    """Whether this process is one rank of several (torchrun's variables, or a process
    group); also where those variables are inconsistent (``train`` reports them)."""
    try:
        return dist_env()[1] > 1
    except ValueError:
        return True


def main(argv: list[str] | None = None) -> int:
    # File names that are not valid in the locale's encoding (Python keeps their bytes as
    # surrogates) are printed escaped instead of ending the command.
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(name)s: %(message)s")
    from dlbooster.sim.flow import CacheError

    # SIGTERM unwinds as Ctrl-C does, so that temporary data sets and partial outputs are
    # removed; not under torchrun, where a rank blocked in a collective would not see it.
    unwind = contextlib.nullcontext() if args.command == "train" and _distributed() else _sigterm_as_interrupt()
    try:
        with unwind:
            return args.func(args)
    except KeyboardInterrupt as exc:   # Ctrl-C: a line, not a traceback (records write leaves no file)
        what = " ".join(w for w in (args.command, getattr(args, "action", None)) if w)
        terminated = isinstance(exc, _Terminated)
        print(f"dlbooster {what}: {'terminated' if terminated else 'interrupted'}", file=sys.stderr)
        return 143 if terminated else 130      # 128 + the signal's number, as a shell reports it
    except CacheError as exc:          # the simulators' build cache: DLBOOSTER_CACHE names another
        print(f"dlbooster {args.command}: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, as other command-line tools do, and
        # keep the interpreter's final flush from raising again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
