"""Judge a recorded chaos run: ``python -m chaos.check path/to/record.json``.

Prints the faults injected and the invariant table. Exits 0 when every invariant holds, 1 on any
violation, and 2, with one line on stderr, when the file cannot be read or is not a recorded run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from chaos.invariants import RecordError, check, format_table

EXIT_HOLDS = 0
EXIT_VIOLATED = 1
# argparse also exits 2 on a usage error: either way, nothing was judged.
EXIT_UNREADABLE = 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos.check", description=__doc__.splitlines()[0])
    parser.add_argument("record", type=Path, help="a recorded run (JSON), as dumped by the chaos campaign")
    path = parser.parse_args(argv).record
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        results = check(record)
    except OSError as exc:
        return _unreadable(f"cannot read {path}: {exc.strerror or exc}")
    except UnicodeDecodeError:
        return _unreadable(f"{path} is not UTF-8 text")
    except json.JSONDecodeError as exc:
        return _unreadable(f"{path} is not JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}")
    except RecordError as exc:
        return _unreadable(f"{path} is not a recorded run: {exc}")
    print(format_table(record, results))
    return EXIT_HOLDS if all(result.holds for result in results) else EXIT_VIOLATED


def _unreadable(message: str) -> int:
    print(f"chaos.check: {message}", file=sys.stderr)
    return EXIT_UNREADABLE


if __name__ == "__main__":
    sys.exit(main())
