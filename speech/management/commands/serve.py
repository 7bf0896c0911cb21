"""`manage.py serve`: daphne with this project's WebSocket limits and shutdown (what `make run` does).

daphne's own frame limit defaults to 1 MiB, below the contract's 16 MiB session.config. It is set
here from the settings: the largest allowed frame plus 1 MiB, so that a frame somewhat over a
limit still reaches the application and gets the contract's error (4009) rather than a bare close.
daphne runs in this process (speech/server/launcher.py), so SIGTERM stops it after sessions have been
ended, on uvloop's event loop (speech/server/eventloop.py, which manage.py installs before Django starts),
with the project's start and stop (speech/web/lifecycle.py).
"""

import logging
import os

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from speech import security
from speech.conf import conf

FRAME_SLACK_BYTES = 1 << 20

logger = logging.getLogger("speech.serve")


def daphne_args(host, port):
    limit = max(conf.MAX_CONFIG_BYTES, conf.MAX_MESSAGE_BYTES) + FRAME_SLACK_BYTES
    # daphne writes its access log as plain lines to stdout; with JSON logs every line must be a JSON
    # object, so it is left out there (the load balancer's access log has the requests).
    quiet = ["--verbosity", "0"] if settings.LOG_FORMAT == "json" else []
    return [
        *quiet,
        "-b",
        host,
        "-p",
        str(port),
        "--websocket-max-message-size",
        str(limit),
        "--websocket-max-frame-size",
        str(limit),
        "ttsproject.asgi:application",
    ]


class Command(BaseCommand):
    help = "Run daphne on HOST:PORT with the speech WebSocket limits."

    def add_arguments(self, parser):
        parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))

    def handle(self, *args, host, port, **options):
        if refusal := security.refusal(host):
            raise CommandError(refusal)
        if conf.INSECURE and not security.is_loopback(host) and security.problems():
            logger.warning("SPEECH_INSECURE=true: listening on %s with %s", host, "; ".join(security.problems()))
        from speech.server import eventloop
        from speech.server.launcher import SpeechCommandLine
        from speech.web.lifecycle import ServingLifecycle

        # uvloop's where it is installed, chosen by manage.py before Django started (speech/server/eventloop.py).
        loop = eventloop.daphne_loop()
        if loop != "uvloop":
            logger.warning("event loop: asyncio's own (%s)", eventloop.MISSING)
        logger.info("serving on ws://%s:%s/v1/audio/speech/stream (engine %s, event loop %s)", host, port, conf.ENGINE, loop)
        SpeechCommandLine(ServingLifecycle()).run(daphne_args(host, port))
