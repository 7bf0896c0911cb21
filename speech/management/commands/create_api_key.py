"""`manage.py create_api_key NAME [--max-sessions N] [--requests-per-minute N] [--scopes speak,voices,admin]`:
prints the new key once."""

from django.core.management.base import BaseCommand, CommandError

from speech.models import DEFAULT_SCOPES, ApiKey, Scope


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
        parser.add_argument(
            "--requests-per-minute",
            type=int,
            default=None,
            help="REST requests a minute on each instance, 0 for no limit (default: SPEECH_KEY_REQUESTS_PER_MINUTE)",
        )
        parser.add_argument(
            "--scopes",
            default=DEFAULT_SCOPES,
            help=f"comma list of {', '.join(Scope.values)} (default: {DEFAULT_SCOPES}; docs/security.md)",
        )

    def handle(self, *args, name, max_sessions, requests_per_minute, scopes, **options):
        chosen = [scope.strip() for scope in scopes.replace(",", " ").split()]
        unknown = sorted(set(chosen) - set(Scope.values))
        if unknown or not chosen:
            raise CommandError(f"--scopes takes a comma list of {', '.join(Scope.values)}; got {scopes!r}")
        if requests_per_minute is not None and requests_per_minute < 0:
            raise CommandError("--requests-per-minute must be 0 (no limit) or more")
        _, secret = ApiKey.issue(
            name,
            max_sessions=max_sessions,
            requests_per_minute=requests_per_minute,
            scopes=" ".join(s for s in Scope.values if s in chosen),
        )
        self.stdout.write(secret)
