"""The browser Origin policy (docs/protocol.md, Origin).

Server-to-server clients (Python, Pipecat, LiveKit) send no Origin header: they are accepted.
A browser's Origin must match SPEECH_ALLOWED_ORIGINS, or by default the server's ALLOWED_HOSTS;
otherwise the handshake is refused (HTTP 403). Channels' AllowedHostsOriginValidator alone would
refuse every client without an Origin, so this subclass changes just that case.
"""

from channels.security.websocket import OriginValidator
from django.conf import settings

from .conf import conf


class SpeechOriginValidator(OriginValidator):
    def valid_origin(self, parsed_origin):
        if parsed_origin is None:
            return True
        return super().valid_origin(parsed_origin)


def origin_policy(application):
    allowed = conf.ALLOWED_ORIGINS or settings.ALLOWED_HOSTS
    return SpeechOriginValidator(application, allowed)
