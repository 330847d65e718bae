"""Development-only tools: shipped with the source checkout, not with the wheel (see pyproject's packages.find).

``reliability_console.settings`` installs the app only when this package is importable.
"""
