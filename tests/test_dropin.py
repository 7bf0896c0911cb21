"""Drop-in for existing clients, in process (FakeEngine: voices 'fake', 'alt'): `POST /v1/audio/speech`
defaults to mp3 as OpenAI does, SPEECH_VOICE_ALIASES (settings table; an alias never hides an engine or
uploaded voice), `session.configured.voice` naming the voice used, and `GET /v1/models` in OpenAI's
shape. The real clients against a live daphne are tests/test_dropin_live.py."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest
from channels.testing import WebsocketCommunicator
from django.test import AsyncClient

from speech.conf import OMNI_VOICES, OPENAI_VOICES, conf
from speech.engines.fake import FakeEngine
from speech.stream.engine import ReferenceVoice
from speech.stream.errors import SpeechError
from speech.stream.messages import read_config

from .support.communicator import HANG_GUARD_S, PATH, application, event, send

CAPS = dataclasses.replace(FakeEngine().capabilities, reference_audio=True)  # uploaded voices are usable
UNKNOWN = "Unknown voice '{}'. Supported voices: fake, alt"


def resolve(voice, aliases, uploaded=(), caps=CAPS):
    """The voice a session.config naming `voice` gets; `uploaded` are the names of uploaded voices."""

    async def find_voice(name):
        match = next((u for u in uploaded if u.lower() == name.strip().lower()), None)
        return ReferenceVoice(name=match, audio=b"", container="wav", transcript="", language="") if match else None

    payload = {"type": "session.config", "session": {"voice": voice}}
    return asyncio.run(read_config(payload, caps, find_voice, voice_aliases=aliases)).config.voice


def refusal(voice, aliases, uploaded=()):
    with pytest.raises(SpeechError) as refused:
        resolve(voice, aliases, uploaded)
    return refused.value.message


# -- voice aliases: the rules ------------------------------------------------------------------------


def test_the_default_aliases_cover_openai_and_the_omni_examples():
    defaults = dict(item.split("=") for item in conf.VOICE_ALIASES)
    assert set(defaults) == {*OPENAI_VOICES, *OMNI_VOICES}
    assert set(defaults.values()) == {"default"}
    # the openai SDK's own list of speech voices, read from its types
    from typing import get_args

    from openai.types.audio.speech_create_params import Voice

    literal = next(arg for arg in get_args(Voice) if get_args(arg) and all(isinstance(a, str) for a in get_args(arg)))
    assert set(get_args(literal)) <= set(OPENAI_VOICES)
    assert {"vivian", "ethan"} <= set(OMNI_VOICES)


@pytest.mark.parametrize(
    "voice, aliases, uploaded, expected",
    [
        ("alloy", {"alloy": "default"}, (), "fake"),
        (" ALLOY ", {"alloy": "default"}, (), "fake"),
        ("Vivian", {"vivian": "alt"}, (), "alt"),
        ("alloy", {"alloy": "ALT"}, (), "alt"),
        ("fake", {"fake": "alt"}, (), "fake"),  # an engine voice is never hidden
        ("alloy", {"alloy": "alt"}, ("Alloy",), "Alloy"),  # nor an uploaded one
        ("alloy", {"alloy": "mine"}, ("Mine",), "Mine"),  # an alias may name an uploaded voice
        ("default", {}, (), "fake"),
    ],
    ids=["to-default", "case-and-space", "omni", "target-case", "engine-wins", "upload-wins", "to-upload", "no-alias"],
)
def test_aliases_resolve_after_engine_and_uploaded_voices(voice, aliases, uploaded, expected):
    assert resolve(voice, aliases, uploaded) == expected


def test_without_aliases_and_with_a_dangling_target_the_name_is_unknown():
    assert refusal("alloy", {}) == UNKNOWN.format("alloy")
    assert refusal("alloy", {"alloy": "nobody"}) == UNKNOWN.format("alloy")


def test_an_open_voice_set_gets_the_target_of_an_alias_and_other_names_as_they_are():
    open_caps = dataclasses.replace(CAPS, any_voice=True)
    assert resolve("alloy", {"alloy": "their-voice"}, caps=open_caps) == "their-voice"
    assert resolve("someone", {"alloy": "their-voice"}, caps=open_caps) == "someone"


# -- the setting -------------------------------------------------------------------------------------


def test_an_empty_setting_turns_the_defaults_off(monkeypatch):
    import environ

    from speech.conf import BY_NAME

    monkeypatch.setenv("SPEECH_VOICE_ALIASES", "")
    assert BY_NAME["SPEECH_VOICE_ALIASES"].read(environ.Env()) == []
    monkeypatch.setenv("SPEECH_VOICE_ALIASES", "Alloy = alt,nova=default")
    assert BY_NAME["SPEECH_VOICE_ALIASES"].read(environ.Env()) == ["Alloy = alt", "nova=default"]


@pytest.mark.parametrize("value", [["alloy"], ["alloy=a=b"], ["=alt"], ["alloy= "]])
def test_manage_py_check_refuses_a_malformed_alias(settings, value):
    from speech.checks import check_speech_settings

    settings.SPEECH_VOICE_ALIASES = value
    assert [error.id for error in check_speech_settings(None)] == ["speech.E009"]


# -- through the consumer and the REST view --------------------------------------------------------


async def configured_voice(voice):
    comm = WebsocketCommunicator(application(FakeEngine()), PATH)
    ok, _ = await comm.connect(HANG_GUARD_S)
    assert ok
    try:
        await send(comm, {"type": "session.config", "voice": voice})
        return (await event(comm, "session.configured"))["voice"]
    finally:
        await comm.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_session_configured_reports_the_voice_used(settings):
    assert await configured_voice("alloy") == "fake"
    settings.SPEECH_VOICE_ALIASES = ["alloy=alt"]
    assert await configured_voice("Alloy") == "alt"
    settings.SPEECH_VOICE_ALIASES = []
    comm = WebsocketCommunicator(application(FakeEngine()), PATH)
    await comm.connect(HANG_GUARD_S)
    await send(comm, {"type": "session.config", "voice": "alloy"})
    error = await event(comm, "error")
    assert (error["message"], error["param"]) == (UNKNOWN.format("alloy"), "voice")
    await comm.disconnect()


async def post(body):
    return await AsyncClient().post("/v1/audio/speech", json.dumps(body), content_type="application/json")


@pytest.mark.django_db(transaction=True)
async def test_rest_defaults_to_mp3_and_takes_openai_voices(process_engine):
    response = await post({"model": "tts-1", "voice": "alloy", "input": "Hello there."})
    assert response.status_code == 200, response.content[:300]
    assert response["Content-Type"] == "audio/mpeg"
    assert response.content[:3] == b"ID3" or (response.content[0] == 0xFF and response.content[1] & 0xE0 == 0xE0)


async def test_rest_stream_without_a_format_is_raw_pcm(process_engine):
    response = await post({"input": "One.", "stream": True})
    assert (response.status_code, response["Content-Type"]) == (200, "audio/pcm")
    assert len(b"".join([chunk async for chunk in response.streaming_content])) == 2 * 1200 * 2


# -- GET /v1/models ----------------------------------------------------------------------------------


async def get(path):
    response = await AsyncClient().get(path)
    return response.status_code, json.loads(response.content)


async def test_models_are_listed_in_openais_shape(process_engine):
    status, body = await get("/v1/models")
    assert status == 200
    assert list(body) == ["object", "data"] and body["object"] == "list"
    [model] = body["data"]
    assert set(model) == {"id", "object", "created", "owned_by"}
    assert (model["id"], model["object"]) == ("fake", "model")
    assert isinstance(model["created"], int) and isinstance(model["owned_by"], str)
    assert await get("/v1/models/fake") == (200, model)
    status, body = await get("/v1/models/tts-2")
    assert (status, body["error"]["type"], body["error"]["param"]) == (404, "not_found_error", "model")


async def test_an_upstream_engine_lists_its_model_too(monkeypatch, settings):
    import speech.runtime

    monkeypatch.setattr(speech.runtime, "_engine", FakeEngine())
    monkeypatch.setattr(speech.runtime._engine, "capabilities", dataclasses.replace(CAPS, name="openai"))
    settings.SPEECH_UPSTREAM_MODEL = "Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice"
    _, body = await get("/v1/models")
    assert [m["id"] for m in body["data"]] == ["openai", "Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice"]


async def test_the_openapi_document_lists_the_models_endpoints():
    _, document = await get("/v1/openapi.json")
    assert set(document["paths"]["/v1/models"]) == {"get"}
    assert set(document["paths"]["/v1/models/{model}"]) == {"get"}
