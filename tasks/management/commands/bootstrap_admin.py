"""python manage.py bootstrap_admin [--username admin]: create or reset the local admin, print its password."""

from __future__ import annotations

import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = "Create (or reset the password of) a superuser with a generated password and print it."

    def add_arguments(self, parser):
        parser.add_argument("--username", default="admin")

    def handle(self, *args, **options):
        username = options["username"].strip()
        if not username or len(username) > 150:
            raise CommandError("--username must be 1 to 150 characters")
        password = secrets.token_urlsafe(12)
        user, created = get_user_model().objects.get_or_create(username=username)
        user.is_staff = user.is_superuser = True
        user.set_password(password)
        user.save()
        self.stdout.write(f"{'created' if created else 'reset'} admin user {username!r}; password: {password}")
