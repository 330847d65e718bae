"""A simulator of the external report platform, with fault injection.

Used by the demo (``make run``) and by the test suite. Standard library only: it must run with no Django
settings, in-process (``ReportPlatformSimulator(...).start()``) or as a separate process
(``manage.py run_report_platform``), which tests drive through ``SimulatorControl``.

The wire contract (paths, bodies, status codes, headers) is fixed: clients written against it must work
unchanged with any other implementation. Control endpoints live under ``/_sim/``; they are never faulted
and never recorded.
"""

from tasks.demo.platform_simulator.simulator import (
    ReportPlatformSimulator,
    SimulatorConfig,
    SimulatorControl,
    SimulatorError,
)

__all__ = ["ReportPlatformSimulator", "SimulatorConfig", "SimulatorControl", "SimulatorError"]
