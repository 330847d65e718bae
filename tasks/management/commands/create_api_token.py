"""python manage.py create_api_token <client-name>: the token is printed once, alone on the last line.

The creation (or its refusal) is audited with the actor ``command:<OS user>``.
"""

from django.core.management.base import BaseCommand, CommandError

from tasks.lifecycle.clients import ApiClientError, api_client_create, command_actor


class Command(BaseCommand):
    help = "Create an API client and print its bearer token (only a hash is stored)."

    def add_arguments(self, parser):
        parser.add_argument("client_name")

    def handle(self, *args, **options):
        try:
            client, token = api_client_create(name=options["client_name"], actor=command_actor())
        except ApiClientError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"created API client {client.name!r}; its token (shown only now):")
        self.stdout.write(token)
