#!/usr/bin/env python
import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "reliability_console.settings")
    import django
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import CommandError, execute_from_command_line
    from django.core.management.base import CommandParser, handle_default_options

    try:
        # Set Django up before the command runs (after --settings and
        # --pythonpath, as Django reads them): runserver's autoreloader would
        # swallow a failing setup and wait for a code change that cannot fix a
        # setting, such as a RELIABILITY_PIPELINE_MODULES that does not import.
        parser = CommandParser(add_help=False, allow_abbrev=False)
        parser.add_argument("--settings")
        parser.add_argument("--pythonpath")
        try:
            handle_default_options(parser.parse_known_args(sys.argv[2:])[0])
        except CommandError:
            pass  # the command reports its own option errors
        django.setup()
        execute_from_command_line(sys.argv)
    except ImproperlyConfigured as exc:
        # One readable line, not a traceback, for a misconfigured deployment.
        sys.stderr.write(f"configuration error: {exc}\n")
        sys.exit(2)


if __name__ == "__main__":
    main()
