"""python manage.py revoke_api_token <client-name>: the client's token stops working at once."""

from django.core.management.base import BaseCommand, CommandError

from tasks.clients import ApiClientError, api_client_revoke


class Command(BaseCommand):
    help = "Revoke an API client's token."

    def add_arguments(self, parser):
        parser.add_argument("client_name")

    def handle(self, *args, **options):
        try:
            client = api_client_revoke(name=options["client_name"])
        except ApiClientError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"revoked API client {client.name!r}")
