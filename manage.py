#!/usr/bin/env python
import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "reliability_console.settings")
    import django
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    try:
        # Set up before the command runs: runserver's autoreloader would
        # swallow a failing setup and wait for a code change that cannot fix a
        # setting (a bad RELIABILITY_PIPELINE_MODULES); now every command stops.
        django.setup()
        execute_from_command_line(sys.argv)
    except ImproperlyConfigured as exc:
        # One readable line, not a traceback, for a misconfigured deployment.
        sys.stderr.write(f"configuration error: {exc}\n")
        sys.exit(2)


if __name__ == "__main__":
    main()
