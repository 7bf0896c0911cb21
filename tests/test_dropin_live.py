"""Existing clients, unchanged, against a live daphne with the real engine: the openai SDK's quickstart
call (no response_format, an OpenAI voice name, `stream_to_file("speech.mp3")`) and vLLM-Omni's own
streaming client (tests/support/vendor/, run as a subprocess with its defaults: speaker `Vivian`,
language `Auto`, task_type `CustomVoice`, per-sentence WAV files). Whisper listens to what they saved."""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
import wave
from pathlib import Path

import av
import numpy as np
import pytest

from tests.support.live import module_server
from tests.support.speech_check import assert_heard, pcm16_to_float, rms

pytestmark = [pytest.mark.live, pytest.mark.heavy]

VENDOR = Path(__file__).resolve().parent / "support" / "vendor"
VLLM_CLIENT = VENDOR / "vllm_omni" / "streaming_speech_client.py"
VLLM_CLIENT_SHA256 = "675e77f248a6d9a95dac5f1ad77a826783f4e5ec51fca48b275ff342bbadc1d0"
TEXT = "Today is a wonderful day to build something people love!"
SENTENCES = ["Hello world.", "How are you?", "I am fine."]


server = module_server({"SPEECH_ENGINE": "hibari"})


def decode_mp3(data):
    """Samples and rate of an MP3 byte string, through FFmpeg's mp3 decoder (PyAV); fails on anything else."""
    with av.open(io.BytesIO(data), format="mp3") as container:
        stream = container.streams.audio[0]
        assert stream.codec_context.name in ("mp3", "mp3float")
        frames = [frame.to_ndarray() for frame in container.decode(stream)]
        return np.concatenate(frames, axis=1)[0].astype(np.float32), stream.rate


@pytest.mark.parametrize("model", ["tts-1", "gpt-4o-mini-tts"])
def test_openai_quickstart_writes_an_mp3_that_speaks(server, whisper, tmp_path, model):
    from openai import OpenAI

    client = OpenAI(base_url=f"{server.http_url}/v1", api_key="unused", max_retries=0)
    speech_file_path = tmp_path / "speech.mp3"
    with client.audio.speech.with_streaming_response.create(model=model, voice="alloy", input=TEXT) as response:
        response.stream_to_file(speech_file_path)
    data = speech_file_path.read_bytes()
    assert data[:3] == b"ID3" or (data[0] == 0xFF and data[1] & 0xE0 == 0xE0), data[:16]
    samples, rate = decode_mp3(data)
    assert rms(samples) > 0.02
    assert_heard(whisper, samples, rate, TEXT)


def test_openai_sdk_lists_the_served_model(server):
    from openai import OpenAI

    client = OpenAI(base_url=f"{server.http_url}/v1", api_key="unused", max_retries=0)
    models = client.models.list().data
    assert [model.id for model in models] == ["hibari"]
    assert client.models.retrieve("hibari").owned_by == models[0].owned_by


def run_vllm_client(server, out_dir, *extra):
    """vLLM-Omni's client as its users run it: only the endpoint, the text and the folder given."""
    assert hashlib.sha256(VLLM_CLIENT.read_bytes()).hexdigest() == VLLM_CLIENT_SHA256, "the vendored client was edited"
    args = [sys.executable, str(VLLM_CLIENT), "--url", server.ws_url, "--text", " ".join(SENTENCES)]
    done = subprocess.run([*args, "--output-dir", str(out_dir), *extra], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ERROR" not in done.stdout and f"Session complete: {len(SENTENCES)} sentence(s) generated" in done.stdout
    return sorted(out_dir.iterdir())


def test_vllm_omni_streaming_client_with_its_defaults(server, whisper, tmp_path):
    files = run_vllm_client(server, tmp_path)
    assert [f.name for f in files] == [f"sentence_{i:03d}.wav" for i in range(len(SENTENCES))]
    for path, sentence in zip(files, SENTENCES):
        with wave.open(str(path)) as audio:
            assert (audio.getnchannels(), audio.getsampwidth(), audio.getframerate()) == (1, 2, 24000)
            samples = pcm16_to_float(audio.readframes(audio.getnframes()))
        assert_heard(whisper, samples, 24000, sentence)


def test_vllm_omni_streaming_client_word_by_word_with_streamed_pcm(server, whisper, tmp_path):
    stt = ("--simulate-stt", "--stt-delay", "0.02")
    files = run_vllm_client(server, tmp_path, *stt, "--response-format", "pcm", "--stream-audio")
    assert [f.name for f in files] == [f"sentence_{i:03d}.pcm" for i in range(len(SENTENCES))]
    samples = pcm16_to_float(b"".join(path.read_bytes() for path in files))
    assert_heard(whisper, samples, 24000, " ".join(SENTENCES))
