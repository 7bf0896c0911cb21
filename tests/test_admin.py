"""The admin through Django's test client, logged in as a superuser: the voice list with its player,
checked uploads, deactivate/activate, deletes that take the files with them, API keys shown once,
revocation, and `manage.py create_api_key`."""

from __future__ import annotations

import html
import re
from io import StringIO

import pytest
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.utils import formats, timezone

from speech.admin import VoiceUploadForm
from speech.models import ApiKey, Voice
from speech.voices import create_voice
from speech.web import auth

from .support import audio_samples as samples

VOICE_LIST = "/admin/speech/voice/"
VOICE_ADD = "/admin/speech/voice/add/"
KEY_LIST = "/admin/speech/apikey/"
KEY_ADD = "/admin/speech/apikey/add/"
PASSWORD = "a-long-test-password-1"
PLAYER = re.compile(r'<audio\b[^>]*\bsrc="([^"]+)"[^>]*>')
KEY_IN_MESSAGE = re.compile(r"<code>(tts_[0-9a-f]{8}\.[A-Za-z0-9_-]+)</code>")


@pytest.fixture(autouse=True)
def engine(process_engine, fast_passwords):
    return process_engine


@pytest.fixture
def superuser(django_user_model):
    return django_user_model.objects.create_superuser("root", "root@example.com", PASSWORD)


@pytest.fixture
def admin(client, superuser):
    assert client.login(username="root", password=PASSWORD)
    return client


def files_under(root):
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()) if root.exists() else []


def stored(name="alice", kind="wav", **kwargs):
    return create_voice(
        name=name,
        consent="yes",
        data=samples.good(kind),
        filename=samples.NAMES[kind],
        content_type=samples.CONTENT_TYPES[kind],
        **kwargs,
    )


def add_form(name="alice", file=None, **overrides):
    """What a browser posts from the add page: is_active is pre-checked there."""
    data = {
        "name": name,
        "consent": "The speaker agreed in writing.",
        "transcript": "Hello there.",
        "language": "en",
        "is_active": "on",
        "audio_sample": file or samples.good_upload("wav"),
    }
    data.update(overrides)
    return {k: v for k, v in data.items() if v is not None}


def form_errors(response):
    assert response.status_code == 200, response.status_code
    return response.context["adminform"].form.errors


def messages_of(response):
    return [str(m) for m in response.context["messages"]]


# -- login and list --------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_login_then_the_changelist_shows_duration_rate_creation_time_and_a_player(client, superuser, media):
    assert client.get(VOICE_LIST).status_code == 302
    response = client.post("/admin/login/", {"username": "root", "password": PASSWORD, "next": VOICE_LIST})
    assert response.status_code == 302 and response["Location"] == VOICE_LIST
    voice = stored("alice", "flac")
    response = client.get(VOICE_LIST)
    assert response.status_code == 200
    page = response.content.decode()
    for header in ("Duration (s)", "Sample rate", "Created at", "Listen"):
        assert f">{header}<" in page
    row = re.search(r"<tr>.*?field-name.*?</tr>", page, re.S).group(0)
    assert '<td class="field-duration_s">2.0</td>' in row
    assert '<td class="field-sample_rate">22050</td>' in row
    created = formats.localize(timezone.template_localtime(voice.created_at))
    assert f'<td class="field-created_at nowrap">{html.escape(created)}</td>' in row
    src = PLAYER.search(row).group(1)
    assert src == f"/admin/speech/voice/{voice.pk}/audio/"


@pytest.mark.django_db
@pytest.mark.parametrize(
    "kind,content_type",
    [
        ("wav", "audio/wav"),
        ("flac", "audio/flac"),
        ("mp3", "audio/mpeg"),
        ("ogg", "audio/ogg"),
        ("m4a", "audio/mp4"),
        ("webm", "audio/webm"),
    ],
)
def test_the_player_url_streams_the_file_with_an_audio_type(admin, media, kind, content_type):
    voice = stored(f"v-{kind}", kind)
    src = PLAYER.search(admin.get(VOICE_LIST).content.decode()).group(1)
    response = admin.get(src)
    assert response.status_code == 200
    assert response["Content-Type"] == content_type
    assert b"".join(response.streaming_content) == samples.good(kind) == (media / voice.audio.name).read_bytes()


@pytest.mark.django_db
def test_the_change_page_has_the_player_too(admin, media):
    voice = stored()
    page = admin.get(f"/admin/speech/voice/{voice.pk}/change/").content.decode()
    assert PLAYER.search(page).group(1) == f"/admin/speech/voice/{voice.pk}/audio/"


@pytest.mark.django_db
def test_the_player_is_closed_to_anonymous_and_unprivileged_users(client, django_user_model, media):
    voice = stored()
    url = f"/admin/speech/voice/{voice.pk}/audio/"
    anonymous = client.get(url)
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/admin/login/")
    django_user_model.objects.create_user("plain", password=PASSWORD)
    assert client.login(username="plain", password=PASSWORD)
    assert client.get(url).status_code == 302  # not staff: back to the login page
    django_user_model.objects.create_user("staff", password=PASSWORD, is_staff=True)
    assert client.login(username="staff", password=PASSWORD)
    response = client.get(url)
    assert response.status_code in (403, 404)
    assert not hasattr(response, "streaming_content")
    staff = django_user_model.objects.get(username="staff")
    staff.user_permissions.add(Permission.objects.get(codename="view_voice"))
    assert client.get(url).status_code == 200


@pytest.mark.django_db
def test_the_player_of_a_missing_voice_is_404(admin, media):
    assert admin.get("/admin/speech/voice/999/audio/").status_code == 404


# -- upload -------------------------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("kind", samples.ALLOWED)
def test_upload_through_the_add_form_creates_row_and_file(admin, media, kind):
    response = admin.post(VOICE_ADD, add_form("Alice", samples.good_upload(kind)))
    assert response.status_code == 302, form_errors(response)
    voice = Voice.objects.get()
    assert (voice.name, voice.container, voice.transcript, voice.language, voice.is_active, voice.created_by) == (
        "Alice",
        kind,
        "Hello there.",
        "en",
        True,
        "root",
    )
    assert voice.sample_rate == samples.RATES[kind]
    assert voice.duration_s == pytest.approx(2.0, abs=0.05)
    assert files_under(media) == [voice.audio.name]
    assert (media / voice.audio.name).read_bytes() == samples.good(kind)


@pytest.mark.django_db
def test_upload_unchecked_active_makes_an_inactive_voice(admin, media):
    assert admin.post(VOICE_ADD, add_form("later", is_active=None)).status_code == 302
    assert Voice.objects.get().is_active is False


INVALID = {
    "truncated": (
        lambda: samples.upload("a.mp3", samples.good("mp3")[:100], "audio/mpeg"),
        "audio_sample",
        "audio_sample is not a readable audio file",
    ),
    "non-audio": (
        lambda: samples.upload("a.wav", samples.TEXT, "audio/wav"),
        "audio_sample",
        "audio_sample is not a readable audio file",
    ),
    "silent": (lambda: samples.upload("a.wav", samples.silent("wav"), "audio/wav"), "audio_sample", "audio_sample is silent"),
    "too-short": (
        lambda: samples.upload("a.wav", samples.wav_bytes(0.4), "audio/wav"),
        "audio_sample",
        "audio_sample must be 1 to 30 seconds long (it is 0.4 s)",
    ),
    "too-long": (
        lambda: samples.upload("a.wav", samples.wav_bytes(40.0, rate=8000), "audio/wav"),
        "audio_sample",
        "audio_sample must be 1 to 30 seconds long (it is 40.0 s)",
    ),
    "aiff-named-wav": (
        lambda: samples.upload("a.wav", samples.sample("aiff"), "audio/wav"),
        "audio_sample",
        "audio_sample must be one of: flac, m4a, mp3, ogg, wav, webm",
    ),
    "lying-extension": (
        lambda: samples.upload("a.flac", samples.good("wav"), "application/octet-stream"),
        "audio_sample",
        "audio_sample is wav audio but its name says .flac",
    ),
    "lying-type": (
        lambda: samples.upload("a.wav", samples.good("wav"), "audio/ogg"),
        "audio_sample",
        "audio_sample is wav audio but was sent as audio/ogg",
    ),
    "oversized": (
        lambda: samples.upload("a.wav", b"RIFF" + b"\x00" * (10 * 1024 * 1024), "audio/wav"),
        "audio_sample",
        "The file is larger than 10 MiB.",
    ),
    "empty-file": (lambda: samples.upload("a.wav", b"", "audio/wav"), "audio_sample", None),
}


@pytest.mark.django_db
@pytest.mark.parametrize("case", INVALID)
def test_invalid_files_show_a_clear_form_error_and_leave_nothing(admin, media, case):
    make, field, message = INVALID[case]
    response = admin.post(VOICE_ADD, add_form("alice", make()))
    errors = form_errors(response)
    assert field in errors, errors
    if message is not None:
        assert errors[field] == [message]
        assert html.escape(message) in response.content.decode()
    assert Voice.objects.count() == 0
    assert files_under(media) == []


@pytest.mark.django_db
@pytest.mark.parametrize("name", ["a/b", "..", "default", "Heart", "FAKE", "n" * 65])
def test_bad_names_are_form_errors_on_name(admin, media, name):
    errors = form_errors(admin.post(VOICE_ADD, add_form(name)))
    assert "name" in errors
    assert Voice.objects.count() == 0 and files_under(media) == []


@pytest.mark.django_db
@pytest.mark.parametrize("missing", ["consent", "audio_sample", "name"])
def test_required_fields(admin, media, missing):
    errors = form_errors(admin.post(VOICE_ADD, add_form(**{"name": "alice", missing: None})))
    assert "This field is required." in errors[missing]
    assert Voice.objects.count() == 0 and files_under(media) == []


@pytest.mark.django_db
def test_a_duplicate_name_differing_in_case_is_refused_and_leaves_nothing(admin, media):
    first = stored("Alice")
    errors = form_errors(admin.post(VOICE_ADD, add_form("ALICE", samples.good_upload("flac"))))
    assert errors
    assert list(Voice.objects.values_list("name", flat=True)) == ["Alice"]
    assert files_under(media) == [first.audio.name]


@pytest.mark.django_db
def test_a_duplicate_name_error_is_clear_and_on_the_name_field(admin, media):
    stored("Alice")
    errors = form_errors(admin.post(VOICE_ADD, add_form("alice")))
    assert "name" in errors, errors
    assert "exists" in " ".join(errors["name"])
    assert "speech_voice_name_ci_unique" not in str(errors)


@pytest.mark.django_db
def test_losing_a_name_race_after_validation_is_a_form_error_not_a_crash(admin, media, monkeypatch):
    original = VoiceUploadForm._post_clean

    def validated_then_someone_else_uploads(self):
        original(self)
        if not Voice.objects.exists():
            stored("ALICE", "flac")

    monkeypatch.setattr(VoiceUploadForm, "_post_clean", validated_then_someone_else_uploads)
    response = admin.post(VOICE_ADD, add_form("alice"), follow=True)
    assert response.status_code == 200
    assert response.redirect_chain == [(VOICE_ADD, 302)]  # back to the add form, with the reason
    assert "a voice named &#x27;alice&#x27; exists already" in response.content.decode().lower()
    # The competing upload ran inside this request's transaction (a simulation), so it was rolled
    # back with it; what matters is that this upload left neither a row nor a file of its own.
    assert not Voice.objects.filter(name="alice").exists()
    assert len(files_under(media)) == 1  # the competitor's file only


@pytest.mark.django_db
def test_the_change_form_edits_metadata_but_not_the_name_or_the_audio(admin, media):
    voice = stored("alice")
    url = f"/admin/speech/voice/{voice.pk}/change/"
    response = admin.post(url, {"name": "renamed", "consent": "new consent", "transcript": "New words.", "language": "de"})
    assert response.status_code == 302
    voice.refresh_from_db()
    assert (voice.name, voice.consent, voice.transcript, voice.language, voice.is_active) == (
        "alice",
        "new consent",
        "New words.",
        "de",
        False,
    )
    assert files_under(media) == [voice.audio.name]


# -- actions and deletes -------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_deactivate_and_activate_actions(admin, media):
    a, b, _ = stored("a1"), stored("b1"), stored("c1")
    response = admin.post(VOICE_LIST, {"action": "deactivate", "_selected_action": [a.pk, b.pk]}, follow=True)
    assert "2 voice(s) deactivated." in messages_of(response)
    assert dict(Voice.objects.values_list("name", "is_active")) == {"a1": False, "b1": False, "c1": True}
    response = admin.post(VOICE_LIST, {"action": "activate", "_selected_action": [b.pk]}, follow=True)
    assert "1 voice(s) activated." in messages_of(response)
    assert dict(Voice.objects.values_list("name", "is_active")) == {"a1": False, "b1": True, "c1": True}
    assert len(files_under(media)) == 3


@pytest.mark.django_db(transaction=True)
def test_delete_one_voice_removes_its_file(admin, media):
    keep, gone = stored("keep"), stored("gone", "mp3")
    url = f"/admin/speech/voice/{gone.pk}/delete/"
    assert admin.get(url).status_code == 200  # the confirmation page
    assert files_under(media) == sorted([keep.audio.name, gone.audio.name])
    response = admin.post(url, {"post": "yes"})
    assert response.status_code == 302
    assert list(Voice.objects.values_list("name", flat=True)) == ["keep"]
    assert files_under(media) == [keep.audio.name]


@pytest.mark.django_db(transaction=True)
def test_bulk_delete_action_removes_the_files(admin, media):
    voices = [stored(f"v{i}", kind) for i, kind in enumerate(["wav", "flac", "ogg"])]
    keep = voices.pop()
    selected = [v.pk for v in voices]
    confirm = admin.post(VOICE_LIST, {"action": "delete_selected", "_selected_action": selected})
    assert confirm.status_code == 200 and len(files_under(media)) == 3
    response = admin.post(VOICE_LIST, {"action": "delete_selected", "_selected_action": selected, "post": "yes"}, follow=True)
    assert response.status_code == 200
    assert list(Voice.objects.values_list("name", flat=True)) == ["v2"]
    assert files_under(media) == [keep.audio.name]


# -- API keys ---------------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_adding_an_api_key_shows_it_once_and_stores_only_its_hash(admin):
    response = admin.post(KEY_ADD, {"name": "partner", "max_sessions": "3", "scopes": ["speak"]}, follow=True)
    assert response.status_code == 200
    shown = [KEY_IN_MESSAGE.search(m) for m in messages_of(response)]
    keys = [m.group(1) for m in shown if m]
    assert len(keys) == 1, messages_of(response)
    secret = keys[0]
    assert "will not be shown again" in response.content.decode()
    row = ApiKey.objects.get()
    assert (row.name, row.max_sessions, row.revoked_at) == ("partner", 3, None)
    assert secret.startswith(row.prefix + ".")
    assert row.hashed == ApiKey.digest(secret)
    for value in ApiKey.objects.values().get().values():
        assert secret.split(".", 1)[1] not in str(value)
    assert auth.key_for(secret) == row
    listing = admin.get(KEY_LIST).content.decode()
    assert row.prefix in listing and secret.split(".", 1)[1] not in listing
    change = admin.get(f"/admin/speech/apikey/{row.pk}/change/").content.decode()
    assert secret.split(".", 1)[1] not in change


@pytest.mark.django_db
def test_adding_a_key_without_a_limit_uses_the_setting(admin):
    admin.post(KEY_ADD, {"name": "unlimited", "scopes": ["speak"]}, follow=True)
    assert ApiKey.objects.get().max_sessions is None


@pytest.mark.django_db
def test_revoke_action(admin):
    row, secret = ApiKey.issue("old")
    other, other_secret = ApiKey.issue("other")
    response = admin.post(KEY_LIST, {"action": "revoke", "_selected_action": [row.pk]}, follow=True)
    assert "1 key(s) revoked." in messages_of(response)
    row.refresh_from_db()
    assert row.revoked and row.revoked_at is not None
    assert auth.key_for(secret) is None
    assert auth.key_for(other_secret) == other
    first = row.revoked_at
    response = admin.post(KEY_LIST, {"action": "revoke", "_selected_action": [row.pk]}, follow=True)
    assert "0 key(s) revoked." in messages_of(response)
    row.refresh_from_db()
    assert row.revoked_at == first


@pytest.mark.django_db
def test_create_api_key_command_prints_a_key_that_authenticates():
    out = StringIO()
    call_command("create_api_key", "cli-client", stdout=out)
    secret = out.getvalue().strip()
    assert re.fullmatch(r"tts_[0-9a-f]{8}\.[A-Za-z0-9_-]{40,}", secret)
    key = auth.key_for(secret)
    assert key is not None and key.name == "cli-client" and key.max_sessions is None
    assert key.hashed == ApiKey.digest(secret)
    assert auth.key_for(secret[:-1] + ("A" if secret[-1] != "A" else "B")) is None


@pytest.mark.django_db
def test_create_api_key_command_with_max_sessions():
    out = StringIO()
    call_command("create_api_key", "limited", "--max-sessions", "4", stdout=out)
    assert auth.key_for(out.getvalue().strip()).max_sessions == 4
