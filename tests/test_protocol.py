"""Reading session.config (messages.read_config; docs/protocol.md, session.config fields), and
speech.stream.wire: parse_message and utf8_length_exceeds."""

from __future__ import annotations

import asyncio
import math

import pytest

from speech.engines.fake import FakeEngine
from speech.stream.config import SessionConfig
from speech.stream.errors import BAD_REQUEST, CLOSE_POLICY, SpeechError
from speech.stream.messages import read_config
from speech.stream.wire import parse_message, utf8_length_exceeds

CAPS = FakeEngine().capabilities  # voices fake, alt; 24 kHz; speed 0.25-4.0; no ref_audio/instructions

FORMATS_MESSAGE = "response_format must be one of: aac, alaw, flac, mp3, mulaw, opus, pcm, wav"
STREAM_MESSAGE = "stream_audio=true requires a streamable response_format (pcm, mulaw, alaw, mp3, opus, aac)"
GRANULARITY_MESSAGE = "split_granularity must be one of: clause, sentence"
SPEED_MESSAGE = "speed must be between 0.25 and 4.0"
RATES_MESSAGE = "sample_rate must be one of: 8000, 16000, 22050, 24000, 44100, 48000"


def configured(payload, caps=CAPS):
    """The SessionConfig read from `payload`, no uploaded voices looked up."""
    return asyncio.run(read_config(payload, caps)).config


def config(caps=CAPS, **fields):
    return configured({"type": "session.config", "session": fields}, caps)


def refused(payload_or_fields, caps=CAPS, *, flat=False):
    """The SpeechError read_config raises; every handshake error is fatal with close 4008."""
    if flat:
        payload = {"type": "session.config", **payload_or_fields}
    elif "type" in payload_or_fields:
        payload = payload_or_fields
    else:
        payload = {"type": "session.config", "session": payload_or_fields}
    with pytest.raises(SpeechError) as info:
        configured(payload, caps)
    error = info.value
    assert error.fatal and error.close_code == CLOSE_POLICY == 4008
    assert error.error_type == BAD_REQUEST and error.code == 400
    return error


# -- forms ---------------------------------------------------------------------------------------


def test_defaults_of_an_empty_nested_config():
    assert config() == SessionConfig(
        voice="fake",
        response_format="pcm",
        sample_rate=24000,
        speed=1.0,
        stream_audio=False,
        split_granularity="sentence",
        options={},
    )


@pytest.mark.parametrize(
    "payload",
    [
        {"type": "session.config", "session": {"voice": "alt", "response_format": "wav", "speed": 2}},
        {"type": "session.config", "voice": "alt", "response_format": "wav", "speed": 2},
        {"type": "session.config", "session": None, "voice": "alt", "response_format": "wav", "speed": 2},
    ],
    ids=["nested", "flat", "session-null-is-flat"],
)
def test_nested_and_flat_forms(payload):
    parsed = configured(payload, CAPS)
    assert (parsed.voice, parsed.response_format, parsed.speed) == ("alt", "wav", 2.0)


def test_unknown_keys_are_ignored():
    assert config(colour="blue", volume=3) == config()


@pytest.mark.parametrize(
    "session",
    ["x", 5, [], [{"voice": "alt"}], True, False, 0, ""],
    ids=["string", "int", "empty-list", "list", "true", "false", "zero", "empty-string"],
)
def test_session_must_be_an_object(session):
    error = refused({"type": "session.config", "session": session})
    assert error.message == "session.config session must be an object"
    assert error.param == "session"


# -- raw JSON types --------------------------------------------------------------------------------

TYPE_CASES = [
    ("model", 5, "a string"),
    ("voice", 5, "a string"),
    ("voice", ["fake"], "a string"),
    ("speaker", True, "a string"),
    ("response_format", 1, "a string"),
    ("sample_rate", 24000.0, "an integer"),
    ("sample_rate", "24000", "an integer"),
    ("sample_rate", True, "an integer"),
    ("speed", "1.0", "a number"),
    ("speed", True, "a number"),
    ("speed", [1], "a number"),
    ("stream_audio", 1, "a boolean"),
    ("stream_audio", "true", "a boolean"),
    ("stream_audio", 0, "a boolean"),
    ("split_granularity", 1, "a string"),
    ("language", 1, "a string"),
    ("instructions", {}, "a string"),
    ("ref_audio", 1, "a string"),
    ("ref_text", 1, "a string"),
    ("temperature", "0.5", "a number"),
    ("temperature", False, "a number"),
    ("top_p", "x", "a number"),
    ("top_k", 1.5, "an integer"),
    ("top_k", 40.0, "an integer"),
    ("top_k", True, "an integer"),
    ("repetition_penalty", "1.1", "a number"),
    ("max_new_tokens", 1.0, "an integer"),
    ("seed", "1", "an integer"),
    ("seed", False, "an integer"),
]


@pytest.mark.parametrize("field,value,kind", TYPE_CASES, ids=[f"{f}={v!r}" for f, v, _ in TYPE_CASES])
@pytest.mark.parametrize("flat", [False, True], ids=["nested", "flat"])
def test_raw_type_checks(field, value, kind, flat):
    error = refused({field: value}, flat=flat)
    assert error.message == f"{field} must be {kind}"
    assert error.param == field


@pytest.mark.parametrize(
    "field,value",
    [
        ("speed", 2),
        ("temperature", 1),
        ("top_p", 1),
        ("repetition_penalty", 1),
        ("sample_rate", 24000),
        ("top_k", 40),
        ("max_new_tokens", 100),
        ("seed", 0),
        ("stream_audio", False),
    ],
    ids=lambda v: repr(v),
)
def test_well_typed_values_pass(field, value):
    config(**{field: value})


def test_null_skips_every_check():
    fields = {
        key: None
        for key in (
            "model",
            "voice",
            "speaker",
            "response_format",
            "sample_rate",
            "speed",
            "stream_audio",
            "split_granularity",
            "language",
            "instructions",
            "ref_audio",
            "ref_text",
            "temperature",
            "top_p",
            "top_k",
            "repetition_penalty",
            "max_new_tokens",
            "seed",
        )
    }
    assert config(**fields) == config()


FIRST_FAILURE_CASES = [
    ({"seed": "x", "model": 5}, "model must be a string"),
    ({"speed": "fast", "voice": "nobody"}, "speed must be a number"),  # types before values
    ({"stream_audio": "yes", "response_format": "ogg"}, "stream_audio must be a boolean"),
    ({"response_format": "ogg", "voice": "nobody"}, "Unknown voice 'nobody'. Supported voices: fake, alt"),
    ({"sample_rate": 12345, "response_format": "ogg"}, FORMATS_MESSAGE),
    ({"speed": 9, "sample_rate": 12345}, RATES_MESSAGE),
    ({"stream_audio": True, "response_format": "wav", "speed": 9}, SPEED_MESSAGE),
    ({"split_granularity": "word", "stream_audio": True, "response_format": "wav"}, STREAM_MESSAGE),
    ({"ref_audio": "x", "split_granularity": "word"}, GRANULARITY_MESSAGE),
]


@pytest.mark.parametrize(
    "fields,message",
    FIRST_FAILURE_CASES,
    ids=[m.split(" ")[0] + "-wins-" + str(i) for i, (_, m) in enumerate(FIRST_FAILURE_CASES)],
)
def test_first_failure_wins(fields, message):
    assert refused(fields).message == message


# -- voice -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields,voice",
    [
        ({}, "fake"),
        ({"voice": "default"}, "fake"),
        ({"voice": "DEFAULT"}, "fake"),
        ({"voice": "alt"}, "alt"),
        ({"voice": "ALT"}, "alt"),
        ({"voice": "Fake"}, "fake"),
        ({"speaker": "alt"}, "alt"),
        ({"speaker": "Alt"}, "alt"),
        ({"speaker": "default"}, "fake"),
    ],
    ids=["absent", "default", "DEFAULT", "alt", "ALT", "Fake", "speaker-alt", "speaker-Alt", "speaker-default"],
)
def test_voice(fields, voice):
    assert config(**fields).voice == voice


def test_voice_default_is_the_engines_default():
    caps = FakeEngine(voices=("alt", "fake")).capabilities
    assert config(caps).voice == "alt"
    assert config(caps, voice="default").voice == "alt"


@pytest.mark.parametrize(
    "fields,shown",
    [
        ({"voice": "x"}, "x"),
        ({"speaker": "Nobody"}, "Nobody"),
        ({"voice": ""}, ""),
    ],
    ids=["voice", "speaker", "empty"],
)
def test_unknown_voice(fields, shown):
    error = refused(fields)
    assert error.message == f"Unknown voice '{shown}'. Supported voices: fake, alt"
    assert error.param == "voice"


# -- response_format, sample_rate, speed, stream_audio, split_granularity --------------------------


@pytest.mark.parametrize(
    "value,fmt",
    [("pcm", "pcm"), ("wav", "wav"), (" WAV ", "wav"), ("PCM", "pcm"), ("\tPcm\n", "pcm")],
    ids=["pcm", "wav", "padded-WAV", "PCM", "tab-Pcm"],
)
def test_response_format_is_trimmed_and_lower_cased(value, fmt):
    assert config(response_format=value).response_format == fmt


@pytest.mark.parametrize("value", ["ogg", "", "  ", "mp4", "wave", "pcm16"])
def test_unknown_response_format(value):
    error = refused({"response_format": value})
    assert error.message == FORMATS_MESSAGE
    assert error.param == "response_format"


@pytest.mark.parametrize(
    "value, fmt, rate",
    [
        ("mp3", "mp3", 24000),
        ("flac", "flac", 24000),
        ("aac", "aac", 24000),
        ("wav", "wav", 24000),
        ("opus", "opus", 48000),
        ("mulaw", "mulaw", 8000),
        ("alaw", "alaw", 8000),
        (" MP3 ", "mp3", 24000),
    ],
)
def test_every_listed_format_is_served_at_its_default_rate(value, fmt, rate):
    # Engine's native rate by default, the telephone rate for G.711; Opus always decodes at 48 kHz.
    cfg = config(response_format=value)
    assert (cfg.response_format, cfg.sample_rate) == (fmt, rate)


def test_sample_rate():
    assert config().sample_rate == 24000
    assert config(sample_rate=24000).sample_rate == 24000
    assert config(FakeEngine(sample_rate=16000).capabilities).sample_rate == 16000


@pytest.mark.parametrize("rate", [0, -24000, 12345, 24001, 96000])
def test_sample_rate_not_in_the_list(rate):
    error = refused({"sample_rate": rate})
    assert error.message == RATES_MESSAGE
    assert error.param == "sample_rate"


@pytest.mark.parametrize("rate", [8000, 16000, 22050, 24000, 44100, 48000])
@pytest.mark.parametrize("fmt", ["pcm", "mulaw", "wav", "mp3", "opus"])
def test_every_listed_sample_rate_is_accepted(rate, fmt):
    assert config(response_format=fmt, sample_rate=rate).sample_rate == (48000 if fmt == "opus" else rate)


@pytest.mark.parametrize("speed", [0.25, 4.0, 4, 1, 0.5, 3.999])
def test_speed_in_bounds_inclusive(speed):
    assert config(speed=speed).speed == float(speed)
    assert isinstance(config(speed=speed).speed, float)


@pytest.mark.parametrize("speed", [0.2499, 4.0001, 0, -1, 5, math.inf, -math.inf, math.nan, 1e308])
def test_speed_out_of_bounds(speed):
    error = refused({"speed": speed})
    assert error.message == SPEED_MESSAGE
    assert error.param == "speed"


def test_speed_huge_integer_is_out_of_bounds_not_a_crash():
    # Regression: float(10**400) raised OverflowError instead of this error.
    error = refused({"speed": 10**400})
    assert error.message == SPEED_MESSAGE
    assert error.param == "speed"


@pytest.mark.parametrize("speed", [0.25, 0.49, 2.01, 4.0])
def test_speed_outside_the_engines_range_is_accepted(speed):
    # The pipeline time-stretches what the engine cannot do (speech/audio/transforms.py).
    assert config(FakeEngine(speed_range=(0.5, 2.0)).capabilities, speed=speed).speed == speed


@pytest.mark.parametrize("speed", [0.5, 1.0, 2.0])
def test_speed_inside_the_engines_range(speed):
    assert config(FakeEngine(speed_range=(0.5, 2.0)).capabilities, speed=speed).speed == speed


@pytest.mark.parametrize("fmt", ["wav", " WAV "])
def test_stream_audio_needs_a_raw_format(fmt):
    error = refused({"stream_audio": True, "response_format": fmt})
    assert error.message == STREAM_MESSAGE
    assert error.param == "response_format"


def test_stream_audio_defaults_and_raw_format():
    assert config().stream_audio is False
    assert config(stream_audio=True).stream_audio is True  # default pcm is raw
    assert config(stream_audio=True, response_format="PCM").stream_audio is True
    assert config(stream_audio=False, response_format="wav").response_format == "wav"


@pytest.mark.parametrize("value", ["clause", "sentence"])
def test_split_granularity(value):
    assert config(split_granularity=value).split_granularity == value


@pytest.mark.parametrize("value", ["Sentence", "CLAUSE", " sentence", "sentence ", "word", ""])
def test_split_granularity_is_exact_and_case_sensitive(value):
    error = refused({"split_granularity": value})
    assert error.message == GRANULARITY_MESSAGE
    assert error.param == "split_granularity"


# -- engine features and forwarded options ---------------------------------------------------------


@pytest.mark.parametrize("field", ["ref_audio", "instructions"])
def test_feature_rejected_by_an_engine_without_it(field):
    error = refused({field: "something"})
    assert error.message == f"{field} is not supported by engine 'fake'"
    assert error.param == field


@pytest.mark.parametrize(
    "field,engine",
    [
        ("ref_audio", FakeEngine(reference_audio=True)),
        ("instructions", FakeEngine(instructions=True)),
    ],
    ids=["ref_audio", "instructions"],
)
def test_feature_accepted_and_forwarded_by_an_engine_with_it(field, engine):
    assert config(engine.capabilities, **{field: "data"}).options == {field: "data"}


def test_forwarded_options():
    fields = {
        "model": "m1",
        "language": "en",
        "ref_text": "hello",
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 40,
        "repetition_penalty": 1.1,
        "max_new_tokens": 256,
        "seed": 7,
    }
    parsed = config(voice="alt", speed=1.5, response_format="wav", colour="blue", seed_extra=1, **fields)
    assert parsed.options == fields
    assert parsed.voice == "alt" and parsed.speed == 1.5  # not options


def test_null_options_are_not_forwarded():
    assert config(model=None, seed=None, language="de").options == {"language": "de"}


# -- parse_message ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        "{",
        "",
        "nope",
        "{'type': 'x'}",
        '{"type": "x",}',
        "[1,",
        "\x00",
        '{"speed": NaN}',
        '{"speed": Infinity}',
        '{"speed": -Infinity}',
    ],
    ids=["open-brace", "empty", "word", "single-quotes", "trailing-comma", "open-list", "nul", "NaN", "Infinity", "-Infinity"],
)
@pytest.mark.parametrize("handshake", [False, True], ids=["session", "handshake"])
def test_parse_message_invalid_json(raw, handshake):
    with pytest.raises(SpeechError) as info:
        parse_message(raw, handshake=handshake)
    assert info.value.message.startswith("speech WebSocket message is not valid JSON")
    assert info.value.error_type == BAD_REQUEST and info.value.code == 400
    assert info.value.close_code == (4008 if handshake else None)


@pytest.mark.parametrize(
    "raw",
    [
        "[" * 100000,
        '{"a":' * 100000,
        "[" * 100000 + "]" * 100000,
        '{"type":"input.text","text":' + "[" * 50000 + "]" * 50000 + "}",
    ],
    ids=["open-lists", "open-objects", "closed-lists", "nested-text-field"],
)
def test_parse_message_deeply_nested_json_is_an_error_not_a_crash(raw):
    with pytest.raises(SpeechError) as info:
        parse_message(raw)
    assert info.value.message.startswith("speech WebSocket message is not valid JSON")
    assert not info.value.fatal


@pytest.mark.parametrize("raw", ["[]", "[1]", "1", '"x"', "null", "true", "1.5"])
@pytest.mark.parametrize("handshake", [False, True], ids=["session", "handshake"])
def test_parse_message_non_object(raw, handshake):
    with pytest.raises(SpeechError) as info:
        parse_message(raw, handshake=handshake)
    assert info.value.message == "speech WebSocket messages must be JSON objects"
    assert info.value.close_code == (4008 if handshake else None)


def test_parse_message_object():
    assert parse_message('{"type":"input.text","text":"héllo ☃"}') == {"type": "input.text", "text": "héllo ☃"}


def test_parse_message_huge_integer_is_not_called_nested():
    # Regression: every non-JSONDecodeError ValueError was reported as "nested too deeply".
    with pytest.raises(SpeechError) as info:
        parse_message('{"seed": ' + "1" * 5000 + "}")
    assert info.value.message.startswith("speech WebSocket message is not valid JSON")
    assert "nested" not in info.value.message


# -- utf8_length_exceeds ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,limit,exceeds",
    [
        ("", 0, False),
        ("a", 0, True),
        ("a" * 10, 10, False),
        ("a" * 11, 10, True),
        ("é" * 5, 10, False),  # 2 bytes each
        ("é" * 6, 10, True),  # 6 characters, 12 bytes
        ("€" * 3, 9, False),  # 3 bytes each
        ("€" * 3, 8, True),
        ("😀" * 2, 8, False),  # 4 bytes each: exactly at the len*4 shortcut
        ("😀" * 3, 12, False),
        ("😀" * 3, 11, True),
        ("a😀", 5, False),
        ("a😀", 4, True),
        ("\ud800" * 2, 6, False),  # lone surrogates (JSON "\ud800") count 3 bytes, not a crash
        ("\ud800" * 2, 5, True),
    ],
    ids=lambda v: repr(v) if not isinstance(v, str) or len(v) < 12 else f"<{len(v)} chars>",
)
def test_utf8_length_exceeds(text, limit, exceeds):
    assert utf8_length_exceeds(text, limit) is exceeds


def test_utf8_length_exceeds_large_text():
    text = "ü" * 70000  # 140000 bytes, 70000 characters
    assert utf8_length_exceeds(text, 131072)
    assert not utf8_length_exceeds(text, 140000)
