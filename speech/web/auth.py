"""API keys and browser tokens: who may open a session or call the REST endpoints.

Keys look like `tts_1a2b3c4d.<secret>`; the part before the dot is the visible prefix, the
database keeps only a SHA-256 of the whole key (keys are 256-bit random, so a fast hash is
enough), compared in constant time. Browsers cannot set headers on a WebSocket, so a key
holder asks `POST /v1/audio/speech/tokens` for a short-lived, single-use token for `?token=`.
Neither keys nor tokens are ever logged.

With keys required, a key acts only within its scopes (speech.models.Scope, docs/security.md): a
missing one is refused with 403, `permission_error`, on REST and on the WebSocket alike.
"""

from __future__ import annotations

import hmac
import secrets
from datetime import timedelta
from urllib.parse import parse_qs

from django.utils import timezone

from ..models import AccessToken, ApiKey

TOKEN_TTL = timedelta(seconds=60)
AUTH_FAILED = "Invalid or missing API key"
PERMISSION_ERROR = "permission_error"


def missing_scope(key, *scopes):
    """The refusal's message when `key` holds none of `scopes`, else None."""
    if any(key.allows(scope) for scope in scopes):
        return None
    return f"this API key lacks the '{' or '.join(scopes)}' scope"


def bearer(headers):
    """The key in an `Authorization: Bearer …` header (ASGI header list or Django META), or None."""
    if isinstance(headers, dict):
        value = headers.get("HTTP_AUTHORIZATION", "")
    else:
        value = next((v.decode("latin1") for k, v in headers if k == b"authorization"), "")
    scheme, _, credential = value.partition(" ")
    return credential.strip() or None if scheme.lower() == "bearer" else None


def key_for(secret):
    """The live ApiKey for a clear-text key, or None."""
    if not secret or "." not in secret:
        return None
    key = ApiKey.objects.live().filter(prefix=secret.split(".", 1)[0]).first()
    if key is None or not hmac.compare_digest(key.hashed, ApiKey.digest(secret)):
        return None
    return key


def issue_token(key):
    token = "tok_" + secrets.token_urlsafe(32)
    expires = timezone.now() + TOKEN_TTL
    AccessToken.objects.create(key=key, hashed=ApiKey.digest(token), expires_at=expires)
    return token, int(TOKEN_TTL.total_seconds())


def redeem_token(token):
    """The ApiKey behind a token, using the token up; None if unknown, expired, used or revoked."""
    if not token:
        return None
    now = timezone.now()
    claimed = AccessToken.objects.filter(
        hashed=ApiKey.digest(token), used_at__isnull=True, expires_at__gt=now, key__revoked_at__isnull=True
    ).update(used_at=now)
    if claimed != 1:
        return None
    return AccessToken.objects.select_related("key").get(hashed=ApiKey.digest(token)).key


def websocket_key(scope):
    """The ApiKey a WebSocket handshake presents (header, else ?token=), or None."""
    secret = bearer(scope.get("headers", []))
    if secret:
        return key_for(secret)
    tokens = parse_qs(scope.get("query_string", b"").decode("latin1")).get("token")
    return redeem_token(tokens[0]) if tokens else None
