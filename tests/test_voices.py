"""speech/voices.py: judging an upload by its decoded content, names, storing and finding voices.

Every test that stores anything points MEDIA_ROOT at its own tmp_path, so the project's media/
is never touched; "nothing left behind" means no row and no file anywhere under that root.
"""

from __future__ import annotations

import hashlib
import re

import pytest
from django.db import IntegrityError, transaction

from speech.models import Voice
from speech.stream.engine import ReferenceVoice
from speech.voices import VoiceError, check_claims, check_name, create_voice, delete_voice, find_voice, inspect_audio

from .support import audio_samples as samples

STORED_NAME = re.compile(r"^voices/[0-9a-f]{32}\.(wav|flac|mp3|ogg|m4a|webm)$")


@pytest.fixture(autouse=True)
def engine(process_engine):
    return process_engine


def files_under(root):
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()) if root.exists() else []


def make(name="alice", kind="wav", seconds=2.0, **kwargs):
    data = samples.good(kind, seconds)
    fields = dict(
        name=name,
        consent="I agree to this use of my voice.",
        data=data,
        filename=samples.NAMES[kind],
        content_type=samples.CONTENT_TYPES[kind],
    )
    fields.update(kwargs)
    return create_voice(**fields)


# -- inspect_audio ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", samples.ALLOWED)
def test_each_allowed_container_is_accepted_with_its_facts(kind):
    facts = inspect_audio(samples.good(kind))
    assert facts.container == kind
    assert facts.sample_rate == samples.RATES[kind]
    assert facts.duration_s == pytest.approx(2.0, abs=0.05)
    assert facts.peak > 0.1


@pytest.mark.parametrize("seconds", [1.0, 29.9, 30.0])
def test_durations_at_the_edges_of_1_to_30_s_are_accepted(seconds):
    facts = inspect_audio(samples.wav_bytes(seconds, rate=8000))
    assert facts.duration_s == pytest.approx(seconds, abs=0.001)


@pytest.mark.parametrize("seconds", [0.2, 0.99])
def test_shorter_than_one_second_is_refused(seconds):
    with pytest.raises(VoiceError, match=r"must be 1 to 30 seconds long") as caught:
        inspect_audio(samples.wav_bytes(seconds))
    assert caught.value.param == "audio_sample"


@pytest.mark.parametrize("kind,seconds", [("wav", 30.05), ("wav", 45.0), ("mp3", 35.0), ("ogg", 31.0)])
def test_longer_than_30_s_is_refused(kind, seconds):
    data = samples.wav_bytes(seconds, rate=8000) if kind == "wav" else samples.sample(kind, seconds)
    with pytest.raises(VoiceError, match=r"must be 1 to 30 seconds long"):
        inspect_audio(data)


@pytest.mark.parametrize("kind", samples.ALLOWED)
def test_silence_is_refused_in_every_container(kind):
    with pytest.raises(VoiceError, match=r"^audio_sample is silent$"):
        inspect_audio(samples.silent(kind))


def test_audio_below_minus_40_dbfs_throughout_counts_as_silence_and_just_above_does_not():
    with pytest.raises(VoiceError, match="silent"):
        inspect_audio(samples.nearly_silent("wav"))
    assert inspect_audio(samples.wav_bytes(2.0, amplitude=0.02)).peak == pytest.approx(0.02, abs=0.001)


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(samples.TEXT, id="text"),
        pytest.param(samples.JSON, id="json"),
        pytest.param(samples.PNG, id="png"),
        pytest.param(samples.ZEROS, id="zeros"),
        pytest.param(samples.random_bytes(), id="random"),
        pytest.param(b"", id="empty"),
        pytest.param(samples.raw_pcm_bytes(), id="raw-pcm"),
        pytest.param(samples.video_only("mp4", "mpeg4"), id="mp4-video-only"),
        pytest.param(samples.video_only("webm", "libvpx"), id="webm-video-only"),
    ],
)
def test_non_audio_is_refused(data):
    with pytest.raises(VoiceError) as caught:
        inspect_audio(data)
    assert caught.value.param == "audio_sample"
    assert str(caught.value).startswith("audio_sample ")


@pytest.mark.parametrize(
    "kind,keep",
    [
        ("wav", 30),
        ("wav", 44),
        ("mp3", 100),
        ("flac", 50),
        ("ogg", 60),
        ("webm", 100),
        ("m4a", 1000),
        ("flac", 0.5),
        ("m4a", 0.5),
    ],
)
def test_truncated_files_are_refused(kind, keep):
    data = samples.good(kind, 4.0)
    cut = data[: int(len(data) * keep) if isinstance(keep, float) else keep]
    with pytest.raises(VoiceError, match=r"^audio_sample (is not a readable audio file|holds no audio)$"):
        inspect_audio(cut)


@pytest.mark.parametrize("kind", ["wav", "mp3", "webm"])
def test_a_file_truncated_in_the_middle_is_refused(kind):
    data = samples.good(kind, 4.0)
    with pytest.raises(VoiceError):
        inspect_audio(data[: len(data) // 2])


@pytest.mark.parametrize("kind", ["aiff", "au", "caf"])
def test_audio_in_a_container_outside_the_allow_list_is_refused(kind):
    with pytest.raises(VoiceError, match=r"^audio_sample must be one of: flac, m4a, mp3, ogg, wav, webm$"):
        inspect_audio(samples.sample(kind))


@pytest.mark.django_db
@pytest.mark.parametrize(
    "data",
    [
        pytest.param(samples.sample("aiff"), id="aiff"),
        pytest.param(samples.raw_pcm_bytes(), id="raw-pcm"),
        pytest.param(samples.TEXT, id="text"),
    ],
)
def test_an_allowed_looking_name_and_type_on_disallowed_content_is_refused(media, data):
    with pytest.raises(VoiceError) as caught:
        create_voice(name="sneaky", consent="yes", data=data, filename="sneaky.wav", content_type="audio/wav")
    assert caught.value.param == "audio_sample"
    assert Voice.objects.count() == 0
    assert files_under(media) == []


# -- check_claims -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind,filename",
    [
        ("wav", "voice.mp3"),
        ("wav", "voice.flac"),
        ("mp3", "voice.wav"),
        ("flac", "voice.ogg"),
        ("ogg", "voice.webm"),
        ("m4a", "voice.mp3"),
        ("webm", "voice.m4a"),
        ("wav", "voice.txt"),
        ("wav", "voice.wav.exe"),
    ],
)
def test_a_file_name_that_names_another_type_is_refused(kind, filename):
    facts = inspect_audio(samples.good(kind))
    ext = filename.rsplit(".", 1)[-1]
    with pytest.raises(VoiceError, match=rf"^audio_sample is {kind} audio but its name says \.{ext}$"):
        check_claims(facts, filename, "")


@pytest.mark.parametrize(
    "kind,content_type",
    [
        ("wav", "audio/mpeg"),
        ("mp3", "audio/wav"),
        ("flac", "audio/ogg"),
        ("ogg", "audio/flac"),
        ("m4a", "audio/webm"),
        ("webm", "audio/mp4"),
        ("wav", "text/plain"),
        ("wav", "image/png"),
    ],
)
def test_a_content_type_that_names_another_type_is_refused(kind, content_type):
    facts = inspect_audio(samples.good(kind))
    with pytest.raises(VoiceError, match=rf"^audio_sample is {kind} audio but was sent as {re.escape(content_type)}$"):
        check_claims(facts, samples.NAMES[kind], content_type)


@pytest.mark.parametrize("kind", samples.ALLOWED)
@pytest.mark.parametrize("content_type", ["application/octet-stream", "", None])
def test_neutral_content_types_are_accepted(kind, content_type):
    check_claims(inspect_audio(samples.good(kind)), samples.NAMES[kind], content_type)


@pytest.mark.parametrize(
    "kind,filename,content_type",
    [
        ("wav", "VOICE.WAV", "AUDIO/WAV"),
        ("wav", "take.wave", "audio/x-wav; codecs=1"),
        ("wav", "noextension", ""),
        ("ogg", "a.opus", "audio/opus"),
        ("ogg", "a.oga", "application/ogg"),
        ("m4a", "a.mp4", "video/mp4"),
        ("m4a", "a.aac", "audio/x-m4a"),
        ("webm", "a.weba", "video/webm"),
        ("mp3", "a.mp3", "audio/mp3"),
        ("flac", "a.flac", "audio/x-flac"),
    ],
)
def test_honest_names_and_types_are_accepted(kind, filename, content_type):
    check_claims(inspect_audio(samples.good(kind)), filename, content_type)


# -- names --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["a/b", "../etc", "a\\b", ".", "..", "...", "-_.", "", "   ", "a" * 65, "a b", "héllo", "a\x00b", "name;drop", None]
)
def test_bad_names_are_refused(name):
    with pytest.raises(VoiceError, match=r"^name must be 1 to 64 letters, digits") as caught:
        check_name(name)
    assert caught.value.param == "name"


@pytest.mark.parametrize("name", ["a", "Alice", "alice-2", "my_voice.v1", ".x", "9", "a" * 64])
def test_good_names_are_accepted(name):
    assert check_name(name) == name


def test_names_are_trimmed():
    assert check_name("  bob  ") == "bob"


@pytest.mark.parametrize("name", ["default", "DEFAULT", "heart", "HEART", "Emma", "fake", "ALT"])
def test_default_and_engine_voice_names_are_reserved_ignoring_case(name):
    with pytest.raises(VoiceError, match=rf"^name '{name}' is reserved$") as caught:
        check_name(name)
    assert caught.value.param == "name"


@pytest.mark.django_db
def test_names_are_unique_ignoring_case(media):
    make("Alice")
    before = files_under(media)
    with pytest.raises(VoiceError, match=r"^a voice named 'ALICE' exists already$") as caught:
        make("ALICE", kind="flac")
    assert caught.value.param == "name"
    assert list(Voice.objects.values_list("name", flat=True)) == ["Alice"]
    assert files_under(media) == before


@pytest.mark.django_db
def test_the_database_itself_refuses_a_name_differing_only_in_case(media):
    voice = make("Carol")
    clone = Voice(
        name="carol", consent="x", audio=voice.audio.name, container="wav", sample_rate=1, duration_s=1, sha256="0" * 64
    )
    with pytest.raises(IntegrityError), transaction.atomic():
        clone.save()


# -- create_voice ------------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("kind", samples.ALLOWED)
def test_create_voice_stores_the_file_under_a_random_name_with_the_right_facts(media, kind):
    data = samples.good(kind)
    voice = create_voice(
        name="Dave",
        consent="  signed consent  ",
        data=data,
        filename=f"../../Dave secret.{kind}",
        content_type=samples.CONTENT_TYPES[kind],
        transcript=" Hello there. ",
        language="en",
        created_by="tester",
    )
    voice.refresh_from_db()
    assert STORED_NAME.match(voice.audio.name), voice.audio.name
    assert voice.audio.name.endswith(f".{kind}")
    assert "Dave" not in voice.audio.name and "secret" not in voice.audio.name and ".." not in voice.audio.name
    assert files_under(media) == [voice.audio.name]
    assert (media / voice.audio.name).read_bytes() == data
    assert voice.sha256 == hashlib.sha256(data).hexdigest()
    assert voice.container == kind
    assert voice.sample_rate == samples.RATES[kind]
    assert voice.duration_s == pytest.approx(2.0, abs=0.05)
    assert (voice.name, voice.consent, voice.transcript, voice.language, voice.created_by, voice.is_active) == (
        "Dave",
        "signed consent",
        "Hello there.",
        "en",
        "tester",
        True,
    )


@pytest.mark.django_db
def test_two_uploads_of_the_same_bytes_get_different_files(media):
    a = make("one")
    b = make("two")
    assert a.audio.name != b.audio.name
    assert len(files_under(media)) == 2


BAD_UPLOADS = {
    "truncated": dict(data=samples.good("mp3")[:100], filename="x.mp3", content_type="audio/mpeg"),
    "non-audio": dict(data=samples.TEXT, filename="x.wav", content_type="audio/wav"),
    "silent": dict(data=samples.silent("wav"), filename="x.wav", content_type="audio/wav"),
    "too-short": dict(data=samples.wav_bytes(0.5), filename="x.wav", content_type="audio/wav"),
    "too-long": dict(data=samples.wav_bytes(31.0, rate=8000), filename="x.wav", content_type="audio/wav"),
    "oversized": dict(data=b"RIFF" + b"\x00" * (10 * 1024 * 1024), filename="x.wav", content_type="audio/wav"),
    "aiff-as-wav": dict(data=samples.sample("aiff"), filename="x.wav", content_type="audio/wav"),
    "lying-extension": dict(data=samples.good("wav"), filename="x.mp3", content_type=""),
    "lying-content-type": dict(data=samples.good("wav"), filename="x.wav", content_type="audio/mpeg"),
    "slash-name": dict(name="a/b"),
    "dots-name": dict(name=".."),
    "empty-name": dict(name=""),
    "long-name": dict(name="n" * 65),
    "reserved-name": dict(name="Heart"),
    "no-consent": dict(consent="   "),
}


@pytest.mark.django_db
@pytest.mark.parametrize("case", BAD_UPLOADS)
def test_a_refused_upload_leaves_no_file_and_no_row(media, case):
    fields = dict(name="erin", consent="yes", data=samples.good("wav"), filename="x.wav", content_type="audio/wav")
    fields.update(BAD_UPLOADS[case])
    with pytest.raises(VoiceError) as caught:
        create_voice(**fields)
    expected_param = {"no-consent": "consent"}.get(case, "name" if case.endswith("-name") else "audio_sample")
    assert caught.value.param == expected_param
    assert Voice.objects.count() == 0
    assert files_under(media) == []


@pytest.mark.django_db
@pytest.mark.parametrize("failure", [IntegrityError("duplicate"), RuntimeError("database away")])
def test_a_row_that_cannot_be_saved_takes_its_file_with_it(media, monkeypatch, failure):
    def broken_save(self, *args, **kwargs):
        assert files_under(media) != [], "the file is written before the row"
        raise failure

    monkeypatch.setattr(Voice, "save", broken_save)
    expected = VoiceError if isinstance(failure, IntegrityError) else RuntimeError
    with pytest.raises(expected):
        make("frank")
    assert files_under(media) == []
    assert Voice.objects.count() == 0


# -- delete_voice ----------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_delete_voice_removes_row_and_file(media):
    keep = make("keep", kind="flac")
    gone = make("gone")
    assert len(files_under(media)) == 2
    delete_voice(gone)
    assert list(Voice.objects.values_list("name", flat=True)) == ["keep"]
    assert files_under(media) == [keep.audio.name]


@pytest.mark.django_db(transaction=True)
def test_delete_voice_in_a_transaction_that_rolls_back_keeps_the_file(media):
    voice = make("sticky")
    with pytest.raises(RuntimeError), transaction.atomic():
        delete_voice(voice)
        raise RuntimeError("rolled back")
    assert Voice.objects.filter(name="sticky").exists()
    assert files_under(media) == [voice.audio.name]


# -- find_voice ------------------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("asked", ["Grace", "grace", "GRACE", "  gRaCe "])
def test_find_voice_ignores_case_and_returns_the_audio(media, asked):
    voice = make("Grace", transcript="The quick brown fox.", language="en")
    found = find_voice(asked)
    assert found == ReferenceVoice("Grace", samples.good("wav"), "wav", "The quick brown fox.", "en")
    assert found.audio == (media / voice.audio.name).read_bytes()


@pytest.mark.django_db
def test_find_voice_ignores_inactive_voices_and_unknown_names(media):
    make("Heidi")
    make("Ivan", kind="ogg")
    Voice.objects.filter(name="Heidi").update(is_active=False)
    assert find_voice("heidi") is None
    assert find_voice("nobody") is None
    assert find_voice("a/b") is None
    assert find_voice("ivan").container == "ogg"
    Voice.objects.filter(name="Heidi").update(is_active=True)
    assert find_voice("HEIDI").name == "Heidi"


# -- storage API only ------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_everything_goes_through_the_storage_api(settings, media):
    """With another storage backend (as S3 would be) nothing lands on the disk, and it all still works."""
    from django.core.files.storage import default_storage

    settings.STORAGES = {**settings.STORAGES, "default": {"BACKEND": "django.core.files.storage.InMemoryStorage"}}
    voice = make("Judy", kind="ogg", transcript="Words.")
    assert files_under(media) == []
    assert STORED_NAME.match(voice.audio.name)
    assert default_storage.exists(voice.audio.name)
    with default_storage.open(voice.audio.name, "rb") as stored:
        assert stored.read() == samples.good("ogg")
    assert find_voice("judy").audio == samples.good("ogg")
    delete_voice(voice)
    assert not default_storage.exists(voice.audio.name)
    assert Voice.objects.count() == 0
