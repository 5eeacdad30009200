"""The terminals every command writes to: results on stdout, progress and errors on stderr. One
of each per process, so that a progress bar drawn by a sweep and a line printed by a command
share the same console and never draw over each other."""

from __future__ import annotations

from rich.console import Console

out_console = Console()
err_console = Console(stderr=True)
