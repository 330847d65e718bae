"""A simulator of the external report platform, with fault injection.

Used by the demo (``make run``) and by the test suite. Standard library only: it must run with no Django
settings, in-process (``ReportPlatformSimulator(...).start()``) or as a separate process
(``manage.py run_report_platform``), which tests drive through ``SimulatorControl``.

The wire contract (paths, bodies, status codes, headers) is fixed: clients written against it must work
unchanged with any other implementation. Control endpoints live under ``/_sim/``; they are never faulted
and never recorded.

Modules: ``config`` (start-up configuration, validation of fault settings and rules), ``server`` (HTTP
plumbing), ``api`` (the /v1 wire contract), ``faults`` (the fault model in force), ``simulator`` (state,
operations and control endpoints) and ``control`` (the client of the control endpoints).
"""

from tasks.demo.platform_simulator.config import SimulatorConfig
from tasks.demo.platform_simulator.control import SimulatorControl, SimulatorError
from tasks.demo.platform_simulator.simulator import ReportPlatformSimulator

__all__ = ["ReportPlatformSimulator", "SimulatorConfig", "SimulatorControl", "SimulatorError"]
