"""What the commands print of file names: one line each, whatever the name holds."""

from __future__ import annotations

__all__ = ["CONTROL"]

#: Control characters in file names (a newline would split an input's line in two), as
#: Python escapes them: a :meth:`str.translate` table.
CONTROL = {c: repr(chr(c))[1:-1] for c in (*range(32), 127)}
