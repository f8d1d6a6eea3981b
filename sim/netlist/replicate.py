"""Runs of copies of one bit in a concatenation written as replications
(:func:`replicate_bit_runs`), the last step of
:func:`~dlbooster.sim.netlist.flatten.export_flat_verilog`."""

import re

__all__ = ["replicate_bit_runs"]

# A name in a concatenation (escaped names end at whitespace; one with a comma or a brace
# in it is no such name, so its concatenation is left alone).
_CAT_NAME = r"(?:\\[^\s,{}]+\s|[A-Za-z_][\w$]*\s?)"
# A part of a concatenation: such a name with an optional constant select, or a sized constant.
_PART = rf"\s*(?:{_CAT_NAME}(?:\[\d+(?::\d+)?\])?|\d+'[bodh][0-9a-fA-FxXzZ_?]+)\s*"
# A concatenation of such parts, opening where a concatenation can open (not inside a name).
_CONCAT = re.compile(rf"(?<=[\s(={{,?:])\{{({_PART}(?:,{_PART})*)\}}")
# A part that selects one bit of a name (or one word of a memory).
_BIT = re.compile(rf"{_CAT_NAME}\[\d+\]")


def replicate_bit_runs(verilog: str, shortest: int = 3) -> tuple[str, int]:
    """Write each run of at least ``shortest`` copies of one bit in a concatenation
    (``{ x [15], x [15], ..., x [15:0] }``, Yosys's form of a sign extension) as a
    replication ``{N{x [15]}}``. Verilator evaluates the copies one bit at a time (a
    shift, a mask and an OR each, or a vector sequence) and a replication as one negation
    and mask; the netlist is the same. Lines with a string (``$display``) are left alone.
    Returns the Verilog and the number of runs rewritten."""
    count = 0

    def concat(match) -> str:
        nonlocal count
        parts = match.group(1).split(",")
        out, i = [], 0
        while i < len(parts):
            part = parts[i].strip()
            j = i + 1
            while j < len(parts) and parts[j].strip() == part:
                j += 1
            if j - i >= shortest and _BIT.fullmatch(part):
                out.append(f" {{{j - i}{{{part} }}}}")
                count += 1
            else:
                out.extend(parts[i:j])
            i = j
        return "{" + ",".join(out) + "}"

    lines = [line if '"' in line else _CONCAT.sub(concat, line) for line in verilog.split("\n")]
    return "\n".join(lines), count
