"""python manage.py callback_secret <client-name> [--rotate]: the secret that signs the client's callbacks.

Printed alone on the last line. ``--rotate`` makes a new one; the old one keeps
signing (a second ``v1=``) for ``RELIABILITY_CALLBACK_SECRET_GRACE_SECONDS``. A rotation (or its
refusal) is audited with the actor ``command:<OS user>``.
"""

from django.core.management.base import BaseCommand, CommandError

from tasks.conf import engine_settings
from tasks.lifecycle.clients import ApiClientError, api_client_signing_secret, command_actor


class Command(BaseCommand):
    help = "Print an API client's callback signing secret (made on first use); --rotate replaces it."

    def add_arguments(self, parser):
        parser.add_argument("client_name")
        parser.add_argument(
            "--rotate", action="store_true", help="make a new secret; the old one signs too for a grace period"
        )

    def handle(self, *args, **options):
        name, rotate = options["client_name"], options["rotate"]
        try:
            secret = api_client_signing_secret(name=name, rotate=rotate, actor=command_actor())
        except ApiClientError as exc:
            raise CommandError(str(exc)) from None
        if rotate:
            grace = engine_settings.CALLBACK_SECRET_GRACE_SECONDS
            self.stdout.write(f"rotated the callback signing secret of {name!r}; the previous one signs too")
            self.stdout.write(f"for {grace:g} s (RELIABILITY_CALLBACK_SECRET_GRACE_SECONDS). The new secret:")
        else:
            self.stdout.write(f"callback signing secret of {name!r}:")
        self.stdout.write(secret)
