"""Whether the server may listen where it is asked to (issue 45): off loopback, not with the development
secret key, not with DEBUG, and not without API keys, unless SPEECH_INSECURE says the network is trusted.

`manage.py serve` asks `refusal(host)` before daphne starts and exits with its message, which names
what to set. Loopback (127.0.0.0/8, ::1, `localhost`) is one machine: the defaults serve it as they are.
"""

from __future__ import annotations

import ipaddress

from django.conf import settings

from .conf import conf


def is_loopback(host):
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


def problems():
    """What makes this configuration unsafe on a network, each with what to set."""
    found = []
    if settings.SECRET_KEY == settings.DEVELOPMENT_SECRET_KEY:
        found.append(
            "DJANGO_SECRET_KEY is the development key: set DJANGO_SECRET_KEY (or DJANGO_SECRET_KEY_FILE) to a long random value"
        )
    if not conf.REQUIRE_API_KEY:
        found.append("API keys are off: set SPEECH_REQUIRE_API_KEY=true and create keys with `manage.py create_api_key`")
    if settings.DEBUG:
        found.append("DJANGO_DEBUG is on: unset it")
    return found


def refusal(host):
    """The reason not to listen on `host`, or None."""
    if conf.INSECURE or is_loopback(host):
        return None
    found = problems()
    if not found:
        return None
    return (
        f"refusing to listen on {host}, which is not loopback: "
        + "; ".join(found)
        + ". On a trusted network only, SPEECH_INSECURE=true starts it as it is."
    )
