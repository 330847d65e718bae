"""Run the report platform simulator (with optional fault injection) until SIGINT or SIGTERM."""

from __future__ import annotations

import math
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from tasks.demo.platform_simulator import ReportPlatformSimulator, SimulatorConfig


class Command(BaseCommand):
    help = "Serve a simulator of the external report platform, with fault injection, for the demo and tests."

    # The simulator needs neither the database nor the project's checks; it must start even when they fail.
    requires_system_checks: list[str] = []
    requires_migrations_checks = False

    def add_arguments(self, parser: CommandParser) -> None:
        # Values are parsed in handle() so every bad input becomes one CommandError line.
        parser.add_argument("--port", help="port to listen on (0 picks a free one)")
        parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
        parser.add_argument("--fail-rate", default="0", help="share of calls answered 503, in [0, 1]")
        parser.add_argument("--throttle-rate", default="0", help="share of calls answered 429, in [0, 1]")
        parser.add_argument("--retry-after", default="1", help="Retry-After seconds sent with a 429 (default 1)")
        parser.add_argument("--slow-rate", default="0", help="share of calls answered late, in [0, 1]")
        parser.add_argument("--slow-seconds", default="5", help="delay of a slow answer in seconds (default 5)")
        parser.add_argument("--insufficient-users", default="", help="comma-separated user ids always refused (402)")
        parser.add_argument("--initial-balance", default="100", help="starting quota of every user (default 100)")
        parser.add_argument("--seed", default=None, help="seed of the random fault generator")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["port"] is None:
            raise CommandError("--port is required (0 picks a free port)")
        config = SimulatorConfig(
            host=str(options["host"]).strip(),
            port=_integer(options, "port", 0, 65535),
            fail_rate=_number(options, "fail_rate", 0, 1),
            throttle_rate=_number(options, "throttle_rate", 0, 1),
            retry_after=_number(options, "retry_after", 0),
            slow_rate=_number(options, "slow_rate", 0, 1),
            slow_seconds=_number(options, "slow_seconds", 0),
            insufficient_users=frozenset(u.strip() for u in str(options["insufficient_users"]).split(",") if u.strip()),
            initial_balance=_integer(options, "initial_balance", 0),
            seed=None if options["seed"] is None else _integer(options, "seed"),
        )
        try:
            simulator = ReportPlatformSimulator(config).start()
        except (TypeError, ValueError) as exc:
            raise CommandError(str(exc)) from None
        except OSError as exc:
            raise CommandError(f"cannot listen on {config.host}:{config.port}: {exc.strerror or exc}") from None
        self.stdout.write(f"report platform simulator listening on {simulator.url}")
        self.stdout.flush()
        simulator.serve_forever()


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _number(options: dict[str, Any], name: str, minimum: float, maximum: float | None = None) -> float:
    raw = options[name]
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise CommandError(f"{_flag(name)} must be a number, got {raw!r}") from None
    if not math.isfinite(value):
        raise CommandError(f"{_flag(name)} must be a finite number, got {raw!r}")
    if value < minimum or (maximum is not None and value > maximum):
        bounds = f"between {minimum:g} and {maximum:g}" if maximum is not None else f"at least {minimum:g}"
        raise CommandError(f"{_flag(name)} must be {bounds}, got {raw!r}")
    return value


def _integer(options: dict[str, Any], name: str, minimum: int | None = None, maximum: int | None = None) -> int:
    raw = options[name]
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise CommandError(f"{_flag(name)} must be an integer, got {raw!r}") from None
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        if maximum is None:
            bounds = f"at least {minimum}"
        elif minimum is None:
            bounds = f"at most {maximum}"
        else:
            bounds = f"between {minimum} and {maximum}"
        raise CommandError(f"{_flag(name)} must be {bounds}, got {raw!r}")
    return value
