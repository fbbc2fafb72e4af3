"""A text stream that says whether it is a terminal, for tests of what is drawn only on one.

``TerminalStream(tty=True)`` is an ``io.StringIO`` whose ``isatty()`` returns ``tty``: give it
as the ``stream`` of a progress bar (or put it in place of ``sys.stderr``) and read what was
drawn with ``getvalue()``.
"""

from __future__ import annotations

import io


class TerminalStream(io.StringIO):
    """An in-memory stream that answers ``isatty()`` with ``tty``."""

    def __init__(self, tty: bool = True) -> None:
        super().__init__()
        self.tty = bool(tty)

    def isatty(self) -> bool:
        return self.tty


__all__ = ["TerminalStream"]
