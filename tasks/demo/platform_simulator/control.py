"""The client side of the ``/_sim/`` control endpoints, for a simulator running in another process."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any


class SimulatorError(RuntimeError):
    """A control call to a simulator failed."""


class SimulatorControl:
    """Drive a simulator running in another process through its ``/_sim/`` endpoints."""

    def __init__(self, base_url: str, timeout: float = 5.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        # Never route a local control call through an http_proxy from the environment.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def health(self) -> bool:
        """True when the simulator answers ``/_sim/health``."""
        try:
            return bool(self._request("GET", "/_sim/health", timeout=min(self.timeout, 1.0)).get("ok"))
        except (SimulatorError, OSError):
            return False

    def wait_healthy(self, timeout: float = 10.0) -> None:
        """Poll until healthy; raise ``TimeoutError`` after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not self.health():
            if time.monotonic() >= deadline:
                raise TimeoutError(f"report platform simulator at {self.base_url} not healthy after {timeout}s")
            time.sleep(0.05)

    def calls(self, task_id: str | None = None) -> list[dict[str, Any]]:
        """Call records, optionally for one task."""
        query = "?" + urllib.parse.urlencode({"task_id": task_id}) if task_id is not None else ""
        return self._request("GET", "/_sim/calls" + query)["calls"]

    def state(self) -> dict[str, Any]:
        """Balances, charges, files, notifications and reports."""
        return self._request("GET", "/_sim/state")

    def set_faults(self, **changes: Any) -> dict[str, Any]:
        """Change fault settings; returns the new configuration."""
        if "insufficient_users" in changes:
            changes["insufficient_users"] = sorted(changes["insufficient_users"])
        return self._request("POST", "/_sim/faults", changes)

    def reset(self, **changes: Any) -> dict[str, Any]:
        """Clear everything; returns the fault configuration in force afterwards."""
        if "insufficient_users" in changes:
            changes["insufficient_users"] = sorted(changes["insufficient_users"])
        return self._request("POST", "/_sim/reset", changes)["faults"]

    def _request(self, method: str, path: str, body: object = None, timeout: float | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base_url + path, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with self._opener.open(request, timeout=timeout or self.timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            try:
                detail = exc.read().decode(errors="replace")
            finally:
                exc.close()
            raise SimulatorError(f"{method} {path} -> {exc.code}: {detail}") from None
        except urllib.error.URLError as exc:
            raise SimulatorError(f"{method} {path} failed: {exc.reason}") from None
