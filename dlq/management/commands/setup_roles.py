"""python manage.py setup_roles: create the viewer, operator and supervisor groups."""

from django.core.management.base import BaseCommand

from dlq.roles import roles_setup


class Command(BaseCommand):
    help = "Create or update the console's role groups (viewer, operator, supervisor)."

    def handle(self, *args, **options):
        for name, count in roles_setup().items():
            self.stdout.write(f"group {name!r}: {count} permissions")
