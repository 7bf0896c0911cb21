"""The playground's server side through Django's test client: the page's settings, and staff
tokens (staff only, CSRF-checked, on the user's own playground key, redeemable once)."""

import json
import re

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from speech.models import ApiKey
from speech.web import auth

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("process_engine", "fast_passwords")]


def page_settings(client):
    response = client.get("/")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/html")
    found = re.search(r'<script id="playground-settings" type="application/json">(.*?)</script>', response.content.decode(), re.S)
    return json.loads(found.group(1))


def user(staff):
    return get_user_model().objects.create_user("ann" if staff else "bob", password="x", is_staff=staff)


def test_open_server_page_wants_no_key(settings):
    settings.SPEECH_REQUIRE_API_KEY = False
    found = page_settings(Client())
    assert found["requireKey"] is False and found["staff"] is False and found["voices"] is None
    assert found["nativeRate"] == 24000 and found["defaultVoice"] == "fake"


def test_staff_page_carries_the_voices_when_keys_are_required(settings):
    settings.SPEECH_REQUIRE_API_KEY = True
    client = Client()
    assert page_settings(client)["voices"] is None  # nobody logged in: the key lists them
    client.force_login(user(staff=True))
    assert page_settings(client)["voices"] == [{"name": "fake", "type": "builtin"}, {"name": "alt", "type": "builtin"}]


def test_staff_token_is_for_staff_only():
    client = Client()
    assert client.post("/playground/token").status_code == 403
    client.force_login(user(staff=False))
    response = client.post("/playground/token")
    assert response.status_code == 403 and response.json()["error"]["type"] == "permission_error"
    assert not ApiKey.objects.exists()


def test_staff_token_needs_the_csrf_token():
    client = Client(enforce_csrf_checks=True)
    client.force_login(user(staff=True))
    assert client.post("/playground/token").status_code == 403
    client.get("/")  # sets the CSRF cookie, as the page does
    response = client.post("/playground/token", HTTP_X_CSRFTOKEN=client.cookies["csrftoken"].value)
    assert response.status_code == 201


def test_staff_tokens_share_one_playground_key_and_redeem_once():
    client = Client()
    client.force_login(user(staff=True))
    first, second = (client.post("/playground/token").json() for _ in range(2))
    assert first["expires_in"] == 60 and first["token"] != second["token"]
    key = ApiKey.objects.get()
    assert key.name == "playground: ann"
    assert auth.redeem_token(first["token"]) == key and auth.redeem_token(first["token"]) is None
    key.revoked_at = key.created_at
    key.save()
    assert auth.redeem_token(second["token"]) is None  # revoking the key ends its tokens
    client.post("/playground/token")
    assert ApiKey.objects.live().get().name == "playground: ann"  # a fresh key on next use
