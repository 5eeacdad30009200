"""The sweep options of the experiment and benchmark scripts (argparse), as ``coda compare`` has them."""

from __future__ import annotations

import argparse
from pathlib import Path

from coda.sweep.executor import SweepOptions

#: what ``--ray`` given without an address stands for: a Ray instance started on this machine
LOCAL_RAY = "local"


def add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    """``--jobs N``, ``--ray [ADDRESS]`` and ``--no-resume`` on ``parser``."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--jobs", "-j", type=int, default=None, help="local worker processes running cells at once (default: one per core)")
    where.add_argument("--ray", nargs="?", const=LOCAL_RAY, default=None, metavar="ADDRESS",
                       help="run the cells on the Ray cluster at ADDRESS; with none, on a Ray instance started here "
                            "(pip install 'coda[ray]')")
    parser.add_argument("--no-resume", dest="resume", action="store_false",
                        help="run every cell again instead of reading back the finished ones kept under the output folder")


def sweep_options(args: argparse.Namespace, store: Path | None) -> SweepOptions:
    """The parsed sweep arguments, keeping finished cells in ``store``."""
    ray = None if args.ray is None else "" if args.ray == LOCAL_RAY else args.ray
    return SweepOptions(jobs=args.jobs, ray=ray, store=store, resume=args.resume)
