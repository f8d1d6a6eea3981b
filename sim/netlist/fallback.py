"""What a rewriting pass does with Verilog it was not written for: it raises
:class:`UnknownForm`, and :func:`rewrite_or_keep` then keeps the Verilog as it was."""

from __future__ import annotations

import logging
from collections.abc import Callable

__all__ = ["UnknownForm", "rewrite_or_keep"]

log = logging.getLogger(__name__)


class UnknownForm(ValueError):
    """A rewriting pass met Verilog of a form it was not written for and did not rewrite
    it; ``str()`` is ``"PASS: REASON"``.

    Attributes:
        pass_name: the pass's function name (``"sink_into_enables"``).
        reason: what it met, in words.
    """

    def __init__(self, pass_name: str, reason: str):
        super().__init__(f"{pass_name}: {reason}")
        self.pass_name, self.reason = pass_name, reason


def rewrite_or_keep(rewrite: Callable[..., tuple[str, int]], verilog: str, *args, **kwargs) -> tuple[str, int]:
    """``rewrite(verilog, *args, **kwargs)``: a pass's rewritten Verilog and its count; or,
    where the pass raises :class:`UnknownForm`, ``(verilog, 0)`` after one warning that
    names the pass and the reason.

    For the passes whose output is the same netlist as their input
    (:func:`~dlbooster.sim.netlist.replicate.replicate_bit_runs`,
    :func:`~dlbooster.sim.netlist.sink.sink_into_enables`): their input simulates alike,
    only slower. Not for
    :func:`~dlbooster.sim.netlist.evaluation.one_evaluation_per_clock`, whose output
    changes the clocking its harness drives.
    """
    try:
        return rewrite(verilog, *args, **kwargs)
    except UnknownForm as exc:
        log.warning("%s; the Verilog is kept without this rewriting (the same behaviour, slower to simulate)", exc)
        return verilog, 0
