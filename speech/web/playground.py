"""The playground page at `/`: hear the server, interrupt it, watch its events (static ES modules,
no build step, nothing from a CDN).

It goes through Django's full middleware (speech/web/apihandler.py routes only `/v1/…` and `/healthz`
around it) because a logged-in staff user gets WebSocket tokens from their session, without an
API key: `POST /playground/token` is CSRF-protected and staff-only. Everyone else who needs a
credential types a key into the page, which keeps it in memory only and trades it for tokens at
`POST /v1/audio/speech/tokens`.
"""

from django.http import JsonResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.csrf import ensure_csrf_cookie
from django.views.decorators.http import require_POST

from . import auth
from ..conf import conf
from ..runtime import get_engine
from ..models import ApiKey, Voice

STAFF_KEY_NAME = "playground: {}"


def _is_staff(user):
    return user.is_active and user.is_staff


@ensure_csrf_cookie  # the staff token request needs the CSRF cookie
def page(request):
    caps = get_engine().capabilities
    staff = _is_staff(request.user)
    settings = {
        "requireKey": conf.REQUIRE_API_KEY,
        "staff": staff,
        "staffTokenUrl": reverse("playground-token"),
        "nativeRate": caps.sample_rate,
        "defaultVoice": caps.default_voice,
        # A staff user with keys required has no key for GET /v1/audio/voices: the list comes with the page.
        "voices": _voice_names(caps) if staff and conf.REQUIRE_API_KEY else None,
    }
    return render(request, "speech/playground.html", {"settings": settings})


def _voice_names(caps):
    uploaded = Voice.objects.filter(is_active=True).values_list("name", flat=True)
    return [{"name": v, "type": "builtin"} for v in caps.voices] + [{"name": v, "type": "uploaded"} for v in uploaded]


@require_POST
def staff_token(request):
    """A single-use WebSocket token for a logged-in staff user, on their own playground key.

    The key is made on first use and its secret thrown away: it exists so that the token, the
    session registry and the per-key session limit have a key to point at; revoking it in the
    admin ends its tokens (the next request makes a new one, as staff may create keys anyway)."""
    if not _is_staff(request.user):
        return JsonResponse(
            {
                "error": {
                    "message": "Only a logged-in staff user gets a token without a key",
                    "type": "permission_error",
                    "param": None,
                    "code": 403,
                }
            },
            status=403,
        )
    name = STAFF_KEY_NAME.format(request.user.get_username())
    key = ApiKey.objects.live().filter(name=name).first() or ApiKey.issue(name)[0]
    token, expires_in = auth.issue_token(key)
    return JsonResponse({"token": token, "expires_in": expires_in}, status=201)
