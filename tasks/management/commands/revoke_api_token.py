"""python manage.py revoke_api_token <client-name>: the client's token stops working at once.

Audited with the actor ``command:<OS user>``; an unknown or already revoked client is a refusal (exit 1).
"""

from django.core.management.base import BaseCommand, CommandError

from tasks.lifecycle.clients import ApiClientError, api_client_revoke, command_actor


class Command(BaseCommand):
    help = "Revoke an API client's token."

    def add_arguments(self, parser):
        parser.add_argument("client_name")

    def handle(self, *args, **options):
        try:
            client = api_client_revoke(name=options["client_name"], actor=command_actor())
        except ApiClientError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"revoked API client {client.name!r}")
