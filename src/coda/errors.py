"""User-facing errors: one line that names the input and the fix, exit code 2, no traceback."""

from __future__ import annotations


class CodaError(Exception):
    """An error caused by the user's input (file, flag, config), not by a bug in Coda.

    The CLI prints ``error: <message>`` and exits with code 2; the message must name the
    offending input and say how to fix it.
    """

    exit_code = 2
