"""`python -m speech.client` against a real daphne with the Hibari engine: the files it writes are
decoded and heard by Whisper, stdin is spoken line by line as it arrives, Ctrl-C keeps a valid
partial file and exits 130, and every failure is one line on stderr with a non-zero exit."""

import io
import shutil
import signal
import subprocess
import threading
import time
import wave

import av
import numpy as np
import pytest
import soundfile

from tests.support.live import PROJECT_ROOT, PYTHON, free_port, module_server, serving, wait_for
from tests.support.speech_check import assert_heard, pcm16_to_float

pytestmark = [pytest.mark.live, pytest.mark.heavy]

TWO_SENTENCES = "The quick brown fox jumps over the lazy dog. Then it runs into the forest."
LONG = " ".join(f"This is sentence number {n}, and it goes on for a little while." for n in range(1, 31))
RUN_TIMEOUT_S = 120  # hang guard


server = module_server({"SPEECH_ENGINE": "hibari"})


def client(*args, url, **kwargs):
    return subprocess.run(
        [PYTHON, "-m", "speech.client", "--url", url, *args],
        cwd=PROJECT_ROOT,
        capture_output=True,
        timeout=RUN_TIMEOUT_S,
        **kwargs,
    )


class Running:
    """The client as a process whose stderr lines and stdout bytes are collected as they come."""

    def __init__(self, args, url, cwd=PROJECT_ROOT):
        self.proc = subprocess.Popen(
            [PYTHON, "-m", "speech.client", "--url", url, *args],
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.lines, self.stdout = [], bytearray()
        self.readers = [threading.Thread(target=self._err, daemon=True), threading.Thread(target=self._out, daemon=True)]
        for reader in self.readers:
            reader.start()

    def _err(self):
        for line in self.proc.stderr:
            self.lines.append(line.decode())

    def _out(self):
        while chunk := self.proc.stdout.read1(65536):
            self.stdout += chunk

    def saw(self, prefix):
        return any(line.startswith(prefix) for line in self.lines)

    def wait(self):
        code = self.proc.wait(timeout=RUN_TIMEOUT_S)
        for reader in self.readers:
            reader.join(timeout=RUN_TIMEOUT_S)
        return code


def test_wav_file_holds_the_speech(server, whisper, tmp_path):
    out = tmp_path / "out.wav"
    done = client("-o", str(out), "--rate", "16000", TWO_SENTENCES, url=server.ws_url)
    assert done.returncode == 0, done.stderr
    progress = done.stderr.decode()
    assert "[0] 'The quick brown fox jumps over the lazy dog.': first audio" in progress
    assert "[1] 'Then it runs into the forest.': first audio" in progress
    with wave.open(str(out)) as wav:
        assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (1, 2, 16000)
    samples, rate = soundfile.read(out, dtype="float32")
    assert_heard(whisper, samples, rate, TWO_SENTENCES)


def test_timestamps_flag_prints_each_words_times(server, tmp_path):
    out = tmp_path / "out.wav"
    done = client("-o", str(out), "--timestamps", TWO_SENTENCES, url=server.ws_url)
    assert done.returncode == 0, done.stderr
    lines = [line.split() for line in done.stderr.decode().splitlines() if line.endswith(tuple("abcdefghijklmnopqrstuvwxyz"))]
    timed = [(int(start), int(end), word) for index, start, end, unit, word in (line for line in lines if len(line) == 5)]
    assert [word for _, _, word in timed] == TWO_SENTENCES.replace(".", "").split()
    assert all(start <= end for start, end, _ in timed)


def test_mp3_file_of_several_sentences_decodes_whole(server, whisper, tmp_path):
    out = tmp_path / "out.mp3"
    done = client("-o", str(out), "--clause", "--speed", "1.2", TWO_SENTENCES + " One, two, three.", url=server.ws_url)
    assert done.returncode == 0, done.stderr
    assert "[2] 'One,': first audio" in done.stderr.decode()  # clause splitting
    samples, rate = soundfile.read(out, dtype="float32")  # one file: the streamed sentences all decode
    assert_heard(whisper, samples, rate, TWO_SENTENCES + " One, two, three.", max_wer=0.15)


def test_opus_file_is_one_ogg_stream_that_plays_whole(server, whisper, tmp_path):
    out = tmp_path / "out.opus"
    done = client("-o", str(out), TWO_SENTENCES, url=server.ws_url)
    assert done.returncode == 0, done.stderr
    data = out.read_bytes()
    serials = {data[at + 14 : at + 18] for at in range(len(data)) if data.startswith(b"OggS", at)}
    assert len(serials) == 1  # one logical stream, not one per sentence
    with av.open(str(out)) as container:
        samples = np.concatenate([frame.to_ndarray()[0] for frame in container.decode(audio=0)])
    assert_heard(whisper, samples.astype(np.float32), 48000, TWO_SENTENCES)


def test_stdin_is_spoken_line_by_line_as_it_arrives(server, whisper):
    run = Running([], server.ws_url)  # no -o: raw 16-bit PCM on stdout
    run.proc.stdin.write(b"Hello there.\n")
    run.proc.stdin.flush()
    wait_for(lambda: run.saw("[0] 'Hello there.'"), "the first line is spoken before stdin ends", timeout=60)
    run.proc.stdin.write(b"How are you today?\n")
    run.proc.stdin.close()
    assert run.wait() == 0, run.lines
    assert any(line.startswith("[1] 'How are you today?'") for line in run.lines)
    assert_heard(whisper, pcm16_to_float(bytes(run.stdout)), 24000, "Hello there. How are you today?")


def test_ctrl_c_keeps_the_audio_so_far_and_exits_130(server, tmp_path):
    # Text still coming on stdin keeps the utterance open: Ctrl-C lands in the middle of it.
    out = tmp_path / "partial.wav"
    run = Running(["-o", str(out)], server.ws_url)
    run.proc.stdin.write(LONG[:200].encode() + b"\n")
    run.proc.stdin.flush()
    wait_for(lambda: run.saw("[0] "), "the first sentence has been received", timeout=60)
    run.proc.send_signal(signal.SIGINT)
    assert run.wait() == 130, run.lines
    assert any(line.startswith("cancelled: ") for line in run.lines), run.lines  # input.cancelled came back
    assert not any(line.startswith("error") for line in run.lines), run.lines
    samples, rate = soundfile.read(out, dtype="float32")  # a valid WAV: the header was completed
    assert rate == 24000 and samples.size / rate > 1.0  # at least the first sentence
    assert float(np.sqrt(np.mean(samples**2))) > 0.02


def test_refused_connection_is_one_line_and_exit_3(tmp_path):
    # Run as a copied file outside the project: it needs nothing but websockets.
    copy = tmp_path / "speak.py"
    shutil.copy(PROJECT_ROOT / "speech" / "client.py", copy)
    port = free_port()
    done = subprocess.run(
        [PYTHON, str(copy), "--url", f"http://127.0.0.1:{port}", "Hello."],
        cwd=tmp_path,
        capture_output=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert done.returncode == 3
    lines = done.stderr.decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: cannot connect to ws://127.0.0.1:{port}/v1/audio/speech/stream")


def test_a_server_error_is_one_line_and_exit_1(server):
    done = client("--speed", "9", "Hello.", url=server.ws_url)
    assert done.returncode == 1
    errors = [line for line in done.stderr.decode().splitlines() if line.startswith("error:")]
    assert errors == ["error: speed must be between 0.25 and 4.0 (BadRequestError, 400)"]


def test_flac_is_refused_before_connecting(tmp_path):
    done = client("-o", str(tmp_path / "x.flac"), "Hello.", url=f"ws://127.0.0.1:{free_port()}")
    assert done.returncode == 2 and "use -o FILE.wav" in done.stderr.decode()


def test_bad_key_and_good_key(tmp_path):
    with serving({"SPEECH_ENGINE": "fake", "SPEECH_REQUIRE_API_KEY": "true"}) as srv:
        key = srv.create_api_key("cli")
        bad = client("--key", "tts_00000000.wrong", "Hello.", url=srv.ws_url)
        assert bad.returncode == 1
        assert bad.stderr.decode().splitlines() == ["error: Invalid or missing API key (authentication_error, 401)"]
        good = client("--key", key, "-o", str(tmp_path / "ok.wav"), "-q", "Hello.", url=srv.ws_url)
        assert good.returncode == 0 and good.stderr == b""
        data, rate = soundfile.read(io.BytesIO((tmp_path / "ok.wav").read_bytes()))
        assert rate == 24000 and data.size > 0


def test_silent_stdin_is_kept_alive_past_the_idle_timeout():
    with serving({"SPEECH_ENGINE": "fake", "SPEECH_IDLE_TIMEOUT_S": "1"}) as srv:
        run = Running([], srv.ws_url)
        wait_for(lambda: run.saw("session "), "the session is open")
        # Deliberately idle for three idle timeouts (nothing to poll for: the point is that
        # nothing happens); the client's keep-alives hold the session open.
        time.sleep(3.0)
        assert run.proc.poll() is None, run.lines
        run.proc.stdin.write(b"Still here.\n")
        run.proc.stdin.close()
        assert run.wait() == 0, run.lines
        assert run.saw("[0] 'Still here.'") and len(run.stdout) > 0
