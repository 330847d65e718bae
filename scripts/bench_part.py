"""One part of `make bench`: its options, how it runs from them, its own command line and its results file.

A part module declares ``PART = Part(...)`` with its ``run(**options, keep=, server_url=, output=)`` and
``format_table(results)``. ``scripts/bench.py`` puts every part's options on one parser (with a prefix, e.g.
``--engine-jobs``) and runs the parts one after the other; ``PART.main()`` is the part's own command line.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench_processes import DEFAULT_REDIS_URL, DEFAULT_SERVER_URL, BenchError, exit_on_sigterm


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1 (a bad size fails at parse time, not after an hour of other parts)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    return value


def non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a number >= 0")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return value


class Option:
    """One option of a part: ``--{prefix}{flag}`` on a command line, ``name`` among the part's ``run()`` arguments."""

    def __init__(self, name: str, *, flag: str | None = None, **argparse_settings) -> None:
        self.name = name
        self.flag = flag or name.replace("_", "-")
        self.argparse_settings = argparse_settings


# Every part but the console's uses the benchmarks' Redis database and flushes it.
REDIS_URL_OPTION = Option("redis_url", default=DEFAULT_REDIS_URL, help="bench Redis (flushed!)")


@dataclass(frozen=True)
class Part:
    """A part of `make bench`: ``run`` measures and writes ``output``, ``format_table`` prints the results."""

    name: str  # as the messages of scripts/bench.py name it: "engine", "API", ...
    run: Callable[..., dict]
    format_table: Callable[[dict], str]
    options: tuple[Option, ...]
    default_output: Path
    doc: str  # the part module's docstring: its first line describes the command line
    keep_help: str = "keep the bench database"

    def add_arguments(self, parser: argparse.ArgumentParser, prefix: str = "") -> None:
        """The part's options (``prefix`` names them apart when they share a parser with other parts')."""
        for option in self.options:
            parser.add_argument(f"--{prefix}{option.flag}", **option.argparse_settings)

    def run_from_options(self, options: argparse.Namespace, prefix: str = "", **kwargs) -> dict:
        """``run()`` with the options ``add_arguments(parser, prefix)`` declared, and ``kwargs`` (keep, ...)."""
        values = {option.name: getattr(options, f"{prefix}{option.flag}".replace("-", "_")) for option in self.options}
        return self.run(**values, **kwargs)

    def main(self, argv: list[str] | None = None) -> int:
        """The part's own command line: run it, print its table; 1 when it could not run."""
        exit_on_sigterm()
        parser = argparse.ArgumentParser(description=self.doc.splitlines()[0])
        self.add_arguments(parser)
        parser.add_argument("--keep", action="store_true", help=self.keep_help)
        parser.add_argument("--server-url", default=DEFAULT_SERVER_URL, help="PostgreSQL server, without a database")
        parser.add_argument("--output", type=Path, default=self.default_output)
        options = parser.parse_args(argv)
        try:
            results = self.run_from_options(
                options, keep=options.keep, server_url=options.server_url, output=options.output
            )
        except BenchError as exc:
            print(f"bench: {exc}", file=sys.stderr)
            return 1
        print()
        print(self.format_table(results))
        print(f"\nwritten to {options.output}")
        return 0


def write_results(output: Path | None, results: dict) -> None:
    if output:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(results, indent=2) + "\n")
