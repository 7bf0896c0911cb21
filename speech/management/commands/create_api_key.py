"""`manage.py create_api_key NAME [--max-sessions N]`: prints the new key once."""

from django.core.management.base import BaseCommand

from speech.models import ApiKey


class Command(BaseCommand):
    help = "Create an API key and print it (it is stored hashed and cannot be shown again)."

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument(
            "--max-sessions",
            type=int,
            default=None,
            help="concurrent sessions across instances (default: SPEECH_MAX_SESSIONS_PER_KEY)",
        )

    def handle(self, *args, name, max_sessions, **options):
        _, secret = ApiKey.issue(name, max_sessions=max_sessions)
        self.stdout.write(secret)
