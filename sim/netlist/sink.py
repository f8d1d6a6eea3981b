"""Combinational logic moved under the enables of the registers that read it, for
Verilator (docs/benchmarks.md, "Logic under enables").

Verilator computes a wire of the flattened netlist in every evaluation of its clock
domain, unless only one expression reads it, which it then inlines there. A register
behind an enable (``if (en) q <= d``) costs only its enable test while the enable is
false, but the wires its ``d`` shares with other registers are computed anyway: the
IDCT's pass inputs, a pipeline stage's shared sums, a payload's unpacking.
:func:`sink_into_enables` moves each wire that registers read only in branches
``if (C)`` on one clock into their process, as a blocking assignment under ``if (C)``,
so that it is computed only in the clocks where ``C`` holds. The netlist's behaviour is
unchanged: a register reads the wire's value at the clock edge either way (the same
register and input values; the process's blocking assignments run before its
non-blocking updates land).
"""

import collections
import re
from dataclasses import dataclass, field

from .fallback import UnknownForm

__all__ = ["sink_into_enables"]

_PASS = "sink_into_enables"

_ID = r"\\\S+|[A-Za-z_][\w$]*"       # an identifier as Yosys writes it (escaped ones end at a space)
# A literal (skipped whole), or a name and the constant bit range read of it, if any.
_SCAN = re.compile(r"\d+'s?[bodhBODH][0-9a-fA-FxXzZ_?]+|(\\\S+(?=\s)|(?<![\w$\\])\$?[A-Za-z_][\w$]*(?![\w$]))"
                   r"(\s*\[(\d+)(?::(\d+))?\])?")
_KEYWORDS = frozenset({"if", "else", "begin", "end", "posedge", "negedge", "or"})
_ASSIGN = re.compile(r"  assign (.+?) = (.+);$")
_TARGET = re.compile(rf"({_ID})(\s*\[\d+(?::\d+)?\])?")
# Declarations of ``[N:0]`` or one bit only: a moved wire's bit ranges are read as shifts.
_WIRE = re.compile(rf"  wire (?:\[(\d+):0\] )?({_ID})\s*;$")
_WIRE_ASSIGN = re.compile(rf"  wire (?:\[(\d+):0\] )?({_ID})\s*= (.+);$")     # declared and driven
_PORT = re.compile(rf"  (?:input|output|inout) (?:signed )?(?:\[[^\]]*\] )?({_ID})")
_PROCESS = re.compile(r"  always @\((.*)\)( begin)?$")


def _names(text: str) -> list[str]:
    """The identifiers an expression or statement reads (not literals, not system
    functions such as ``$signed``)."""
    return [m.group(1) for m in _SCAN.finditer(text + " ")       # an escaped name ends at a space
            if m.group(1) and m.group(1)[0] != "$" and m.group(1) not in _KEYWORDS]


def _declare(net: "_Netlist", match, n: int) -> None:
    """Record the wire ``_WIRE`` or ``_WIRE_ASSIGN`` matched as declared by item ``n``."""
    net.decl[match.group(2)] = n
    net.width[match.group(2)] = int(match.group(1)) + 1 if match.group(1) else 1


@dataclass
class _Branch:
    cond: str | None          # None: an unconditional branch (``else``, or no ``if``)
    lhs: str
    rhs: str


@dataclass
class _Chain:
    """One register's (or memory port's) process: ``always @(sens)`` and an
    if/else-if/else chain with one non-blocking assignment in each branch."""
    sens: str
    branches: list[_Branch]

    @property
    def key(self) -> tuple:
        return self.sens, tuple(b.cond for b in self.branches)


def _chain(sens: str, body: str) -> _Chain | None:
    """Parse ``if (c) s; else if (c) s; else s;`` (each ``s`` one ``lhs <= rhs;``,
    perhaps inside ``begin``/``end``); None for any other form."""
    branches, rest = [], body.strip()
    while rest:
        if branches:
            if not re.match(r"else(?![\w$])", rest):
                return None
            rest = rest[4:].lstrip()
        cond = None
        if rest.startswith("if ("):
            depth = 0
            for i, ch in enumerate(rest):
                depth += (ch == "(") - (ch == ")")
                if depth == 0 and ch == ")":
                    break
            cond, rest = rest[4:i], rest[i + 1:].lstrip()
        wrapped = rest.startswith("begin ")
        if wrapped:
            rest = rest[6:].lstrip()
        stmt, _, rest = rest.partition(";")
        rest = rest.lstrip()
        if wrapped:
            if not rest.startswith("end"):
                return None
            rest = rest[3:].lstrip()
        if "<=" not in stmt or ";" in stmt:
            return None
        lhs, rhs = stmt.split("<=", 1)
        branches.append(_Branch(cond, lhs.strip(), rhs.strip() + " "))    # an escaped name ends at a space
        if cond is None and rest:
            return None
    return _Chain(sens, branches) if branches else None


@dataclass
class _Netlist:
    items: list = field(default_factory=list)    # (kind, payload, lines)
    targets: dict = field(default_factory=dict)  # assign item -> the wires it drives (None: unknown)
    defs: dict = field(default_factory=dict)     # wire -> the assign items that drive it
    whole: set = field(default_factory=set)      # wires one assign drives whole
    width: dict = field(default_factory=dict)    # wire -> bits
    decl: dict = field(default_factory=dict)     # wire -> declaration item index
    uses: collections.defaultdict = field(default_factory=lambda: collections.defaultdict(list))


def _parse(verilog: str) -> _Netlist:
    net = _Netlist()
    lines = verilog.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("  function") or line.startswith("  always") or line.startswith("  initial"):
            j = i + 1
            if line.startswith("  function"):
                while j < len(lines) and lines[j].strip() != "endfunction":
                    j += 1
                if j == len(lines):
                    raise UnknownForm(_PASS, f"line {i + 1} opens a function that no line endfunction closes")
                j += 1
            elif line.rstrip().endswith("begin"):
                depth = 1
                while depth:
                    if j == len(lines):
                        raise UnknownForm(_PASS, f"line {i + 1} opens a block (it ends in begin) that no line end "
                                                 "closes")
                    text = lines[j].strip()
                    depth += text.endswith("begin") - (text == "end" or text.startswith("end "))
                    j += 1
            else:
                while j < len(lines) and lines[j].startswith("    "):
                    j += 1
            block = lines[i:j]
            head = _PROCESS.match(block[0])
            chain = None
            if head:
                chain = _chain(head.group(1), " ".join(x.strip() for x in block[1:-1 if head.group(2) else None]))
            net.items.append(("chain" if chain else "block", chain, block))
            i = j
            continue
        assign, declared = _ASSIGN.match(line), _WIRE_ASSIGN.match(line)
        if declared:
            _declare(net, declared, len(net.items))
            assign = declared
        net.items.append(("assign" if assign else "line", assign and (assign.group(assign.lastindex - 1),
                                                                      assign.group(assign.lastindex)), [line]))
        i += 1
    ports = set()
    for n, (kind, payload, block) in enumerate(net.items):
        if kind == "assign":
            lhs, rhs = payload
            lhs = lhs.strip()
            parts = [part.strip() for part in lhs[1:-1].split(",")] if lhs[0] == "{" and lhs[-1] == "}" else [lhs]
            found = [_TARGET.fullmatch(part) for part in parts]
            wires = None if None in found else [match.group(1) for match in found]
            net.targets[n] = wires
            for name in wires or _names(lhs):
                net.defs.setdefault(name, []).append(n)
            if wires == [lhs]:
                net.whole.add(lhs)
            for name in _names(rhs):
                net.uses[name].append(("assign", n) if wires else ("other",))
        elif kind == "chain":
            for name in _names(payload.sens):
                net.uses[name].append(("other",))
            for branch in payload.branches:
                if branch.cond is not None:
                    for name in _names(branch.cond):
                        net.uses[name].append(("other",))
                target = _TARGET.match(branch.lhs)
                for name in _names(branch.lhs[target.end():] if target else branch.lhs) + _names(branch.rhs):
                    net.uses[name].append(("chain", payload.sens, branch.cond))
        else:
            line = block[0]
            port, wire = _PORT.match(line), _WIRE.match(line)
            if port:
                ports.add(port.group(1))
            elif wire and kind == "line":
                _declare(net, wire, n)
            elif not (line.startswith("  reg ") or line.startswith("module ") or line.startswith(", ")):
                for text in block:
                    for name in _names(text):
                        net.uses[name].append(("other",))
    for name in ports:
        net.decl.pop(name, None)
    return net


def sink_into_enables(verilog: str, max_width: int = 64) -> tuple[str, int]:
    """Move the combinational logic that registers read only under one enable into
    their process, computed only when the enable is true (module docstring).

    ``verilog`` is a flattened module as
    :func:`~dlbooster.sim.netlist.flatten.export_flat_verilog` writes it (after
    :func:`~dlbooster.sim.netlist.evaluation.one_evaluation_per_clock` or not):
    each register or memory port a process ``always @(S)`` with an if/else-if chain of
    non-blocking assignments. A wire moves to the place ``(S, C)`` when:

    - it is declared on its own as ``[N:0]`` or one bit, is not a port, and is at most
      ``max_width`` bits (wider values would be assembled through Verilator's wide-word
      helpers);
    - it is driven only by ``assign`` statements of the whole wire or of constant bit
      ranges of it, or by its declaration (``wire w = expr;``);
    - each of its readers is a branch ``if (C)`` of a process on ``S`` or a wire that
      moves to the same place: a reader of any other kind (an assignment to a
      concatenation, a condition, an output) keeps it, and whatever it reads, where it is.

    Only wires that more than one expression reads (which Verilator would compute on
    every evaluation) and the wires that read them move. The processes that read a
    place's wires become one process: the wires first, as blocking assignments in
    dependency order under ``if (C)`` (at the start of the branch ``if (C)`` when one
    condition chain reads them all), then the processes' chains, those with the same
    conditions sharing one if/else chain unless two of them with different conditions
    write the same register or memory (then each keeps its own, in netlist order). A
    moved wire that one expression reads is substituted into it instead, as
    ``$unsigned(N'(expr))`` (a constant bit range of it as a shift and a cast; never
    under a variable index, where it is assigned).

    Returns the Verilog and the number of wires moved. Processes, assignments and
    declarations in any other form are kept as they are, and what they read stays put.

    Raises:
        UnknownForm: the module cannot be cut into its items: a ``function`` without an
            ``endfunction`` line, or a line ending in ``begin`` without an ``end`` line
            of its own.
    """
    net = _parse(verilog)
    found, busy = {}, object()

    def wire_place(wire):
        """The (sensitivity, condition) under which every reader of ``wire`` reads it,
        or None."""
        if wire in found:
            where = found[wire]
            return None if where is busy else where
        found[wire] = busy
        where = None
        if wire in net.decl and net.width[wire] <= max_width and all(net.targets[n] for n in net.defs[wire]):
            places = set()
            for use in net.uses[wire]:
                at = (use[1], use[2]) if use[0] == "chain" else item_place(use[1]) if use[0] == "assign" else None
                if at is None or at[1] is None:
                    places = None
                    break
                places.add(at)
            if places and len(places) == 1:
                where, = places
        found[wire] = where
        return where

    def item_place(n):
        """The place of every wire the assignment ``n`` drives, or None."""
        places = {wire_place(wire) for wire in net.targets[n]}
        return places.pop() if len(places) == 1 else None

    # An assignment to a concatenation stays (compiled as one, its parts cost more than
    # they save under an enable, docs/benchmarks.md).
    movable = {n: at for n in net.targets
               if net.targets[n] and len(net.targets[n]) == 1 and (at := item_place(n)) is not None}
    # Every assignment that drives a movable wire is movable to the same place.
    movable = {n: at for n, at in movable.items()
               if all(movable.get(m) == at for wire in net.targets[n] for m in net.defs[wire])}

    def reads(n):
        return _names(net.items[n][1][1])

    # What Verilator would compute in every evaluation (a wire more than one expression
    # reads), what reads it, and whatever else drives the same wires.
    moved = {n: at for n, at in movable.items() if any(len(net.uses[w]) > 1 for w in net.targets[n])}
    grown = True
    while grown:
        grown = False
        for n, at in movable.items():
            if n not in moved and (any(m in moved for w in net.targets[n] for m in net.defs[w])
                                   or any(m in moved for w in reads(n) for m in net.defs.get(w, ()))):
                moved[n] = at
                grown = True
    # A moved wire becomes a variable of its process: an assignment that stays (one to a
    # concatenation, say) must not read it. Such a wire stays, with whatever drives it,
    # until no moved wire has a reader outside the moved assignments and the processes.
    while True:
        stranded = {m for n in moved for w in net.targets[n] if any(
            use[0] != "chain" and (use[0] != "assign" or use[1] not in moved) for use in net.uses[w])
            for m in net.defs[w]}
        if not stranded & moved.keys():
            break
        for n in stranded:
            moved.pop(n, None)
    order, seen = [], set()

    def visit(n):
        if n not in seen:
            seen.add(n)
            for wire in reads(n):
                for m in net.defs.get(wire, ()):
                    if m in moved:
                        visit(m)
            order.append(n)

    for n in moved:
        visit(n)
    temps = collections.defaultdict(list)       # place -> assign items in dependency order
    for n in order:
        temps[moved[n]].append(n)
    moved_wires = {wire: moved[n] for n in moved for wire in net.targets[n]}

    # Processes that read the same place become one process (union-find over places).
    parent = {}

    def root(x):
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    readers = {}
    for n, (kind, chain, _) in enumerate(net.items):
        if kind != "chain":
            continue
        mine = {moved_wires[name] for b in chain.branches for name in _names(b.lhs) + _names(b.rhs)
                if name in moved_wires}
        if mine:
            readers[n] = next(iter(mine))
            for at in mine:
                parent[root(at)] = root(readers[n])
    merged = collections.defaultdict(list)
    for n, at in readers.items():
        merged[root(at)].append(n)
    places = collections.defaultdict(list)
    for at in temps:
        places[root(at)].append(at)
    gone = set(moved)
    moved_decl = {net.decl[wire] for wire in moved_wires}
    # Each merged process where its last member was, after every declaration it reads.
    last = {members[-1]: group for group, members in merged.items()}
    inside = {n for members in merged.values() for n in members}
    out = []
    for n, (kind, chain, block) in enumerate(net.items):
        if n in moved_decl:
            out.append(block[0].replace("  wire ", "  reg ", 1).split(" = ", 1)[0].rstrip(";") + ";")
        elif n in gone or (n in inside and n not in last):
            continue
        elif n in last:
            group = last[n]
            out.extend(_process([net.items[m][1] for m in merged[group]], places[group], temps, net))
        else:
            out.extend(block)
    return "\n".join(out), len(moved_wires)


def _process(chains: list[_Chain], places: list, temps: dict, net: _Netlist) -> list[str]:
    """One process for ``chains``. Chains with the same conditions share one if/else
    chain, so that each condition is tested once, unless two chains with different
    conditions write the same register or memory (then every chain keeps its own, in
    their order in the netlist, so that the later write still wins). A place's moved
    wires are assigned at the start of the branch under its condition when one such
    chain reads them all, and under an ``if`` of their own before the chains otherwise."""
    writers = collections.defaultdict(set)
    for chain in chains:
        writers[_names(chain.branches[0].lhs)[0]].add(chain.key)
    shared = all(len(keys) == 1 for keys in writers.values())
    group = [chain.key if shared else i for i, chain in enumerate(chains)]
    conds = {g: chain.key[1] for g, chain in zip(group, chains)}
    home = {}
    for at in places:
        wires = {wire for n in temps[at] for wire in net.targets[n]}
        readers = {g for g, chain in zip(group, chains)
                   if any(name in wires for b in chain.branches for name in _names(b.lhs) + _names(b.rhs))}
        g = next(iter(readers)) if len(readers) == 1 else None
        home[at] = (g, conds[g].index(at[1])) if g is not None and at[1] in conds[g] else None
    stmts = []                  # [lhs, op, rhs, the wire it drives whole or None, (group, branch) or place]
    for at in places:
        for n in temps[at]:
            lhs, rhs = net.items[n][1]
            whole = net.targets[n][0] if net.targets[n] == [lhs.strip()] else None
            stmts.append([lhs, "=", rhs, whole, home[at] or at])
    for g, chain in zip(group, chains):
        stmts += [[b.lhs, "<=", b.rhs, None, (g, k)] for k, b in enumerate(chain.branches)]
    _substitute_single_reads(stmts, net)
    lines = [f"  always @({chains[0].sens}) begin"]
    for at in places:
        if home[at] is None:
            body = [f"      {lhs} = {rhs} ;" for lhs, op, rhs, wire, where in stmts if where == at and wire != ""]
            if body:
                lines += [f"    if ({at[1]}) begin", *body, "    end"]
    for g in dict.fromkeys(group):
        for k, cond in enumerate(conds[g]):
            head = ("if" if k == 0 else "else if") + f" ({cond})" if cond is not None else "" if k == 0 else "else"
            lines.append(f"    {head} begin")
            lines += [f"      {lhs} {op} {rhs} ;" for lhs, op, rhs, wire, where in stmts
                      if where == (g, k) and wire != ""]
            lines.append("    end")
    lines.append("  end")
    return lines


def _reads_of(wire: str, text: str) -> tuple[list, bool]:
    """The reads of ``wire`` in ``text``, by whole tokens: ``(start, end, high, low)``
    each (``high`` None for the whole wire), and whether one is under a variable index."""
    spans, variable = [], False
    padded = text + " "               # an escaped name ends at a space
    for match in _SCAN.finditer(padded):
        if match.group(1) != wire:
            continue
        if match.group(2) is None and re.match(r"\s*\[", padded[match.end():]):
            variable = True
        else:
            spans.append((match.start(), match.end(), match.group(3), match.group(4)))
    return spans, variable


def _substitute_single_reads(stmts: list, net: _Netlist) -> None:
    """Put each moved wire that one expression reads (whole, or a constant bit range of
    it; not under a variable index) into that expression, so that the compiled model
    keeps it in a register instead of storing it; its own statement is marked dropped
    (wire "")."""
    for stmt in stmts:
        wire = stmt[3]
        if not wire or wire not in net.whole or len(net.uses[wire]) != 1:
            continue
        found = []
        for other in stmts:
            if other is stmt or other[3] == "":
                continue
            in_lhs, variable_lhs = _reads_of(wire, other[0])
            in_rhs, variable_rhs = _reads_of(wire, other[2])
            if in_lhs or variable_lhs or variable_rhs:
                found = None
                break
            if in_rhs:
                found.append((other, in_rhs))
        if not found or len(found) != 1 or len(found[0][1]) != 1:
            continue
        (reader, [(start, end, high, low)]), = found
        value = f"$unsigned({net.width[wire]}'({stmt[2]}))"
        if high is not None:
            low = int(low) if low is not None else int(high)
            value = f"$unsigned({int(high) - low + 1}'({value} >> {low}))"
        reader[2] = reader[2][:start] + value + " " + reader[2][end:]
        stmt[3] = ""
