"""Command-line client for the speech server: `python -m speech.client "Hello there."`.

Speaks its arguments, or stdin line by line as the lines arrive (so `llm … | python -m
speech.client` speaks while the model writes). Writes a file with `-o` (WAV, MP3, Opus, AAC or
raw), or raw audio to stdout for a player (`| ffplay -f s16le -ar 24000 -`). Progress (segments,
time to first audio) goes to stderr. Ctrl-C sends `input.cancel`, keeps the audio so far and
exits with 130. Every server error or failed connection is one line on stderr and a non-zero
exit: 1 server error, 2 usage, 3 cannot connect, 130 interrupted.

This file needs only the standard library and `websockets`: copy it anywhere.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import threading
import time
import wave
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

DEFAULT_URL = "ws://127.0.0.1:8000/v1/audio/speech/stream"
WS_PATH = "/v1/audio/speech/stream"
EXIT_OK, EXIT_SERVER, EXIT_USAGE, EXIT_CONNECT, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
RAW = ("pcm", "mulaw", "alaw")
# Compressed formats the server streams as one stream a session (docs/protocol.md, streamed compressed
# audio): written as they come, they make one file that plays. FLAC is never streamed; WAV is written here.
STREAMED = ("mp3", "aac", "opus")
EXTENSIONS = {
    ".wav": "wav",
    ".mp3": "mp3",
    ".opus": "opus",
    ".ogg": "opus",
    ".aac": "aac",
    ".pcm": "pcm",
    ".raw": "pcm",
    ".ulaw": "mulaw",
    ".mulaw": "mulaw",
    ".alaw": "alaw",
    ".flac": "flac",
}
CANCEL_WAIT_S = 5.0  # after Ctrl-C, how long the server's answer to input.cancel is awaited


class UsageError(Exception):
    pass


# -- output ---------------------------------------------------------------------------------------


class RawOut:
    """Streamed audio (raw samples, or the frames of one mp3/opus/aac stream) to a file or stdout, as it arrives."""

    def __init__(self, stream):
        self.stream = stream

    def start(self, rate):
        pass

    def write(self, data):
        self.stream.write(data)
        self.stream.flush()

    def close(self):
        if self.stream is not sys.stdout.buffer:
            self.stream.close()


class WavOut:
    """A 16-bit mono WAV file from the PCM stream; its header is completed on close (Ctrl-C too)."""

    def __init__(self, path):
        self.path, self.file = path, None

    def start(self, rate):
        self.file = wave.open(str(self.path), "wb")
        self.file.setnchannels(1)
        self.file.setsampwidth(2)
        self.file.setframerate(rate)

    def write(self, data):
        self.file.writeframesraw(data)

    def close(self):
        if self.file is not None:
            self.file.close()


def output_for(args):
    """(format asked of the server, writer) for the command line: the server streams every format asked."""
    fmt = args.format
    if fmt is None:
        fmt = EXTENSIONS.get(Path(args.output).suffix.lower(), "pcm") if args.output else "pcm"
    if fmt == "flac":
        raise UsageError("flac cannot be streamed: use -o FILE.wav (or mp3, opus, aac)")
    if fmt == "wav":
        if not args.output:
            raise UsageError("wav needs -o FILE; stdout gets raw audio (--format pcm, mulaw or alaw)")
        return "pcm", WavOut(args.output)
    if fmt not in RAW + STREAMED:
        raise UsageError(f"unknown format {fmt!r}: wav, mp3, opus, aac, pcm, mulaw or alaw")
    stream = open(args.output, "wb") if args.output else sys.stdout.buffer
    return fmt, RawOut(stream)


# -- text in ----------------------------------------------------------------------------------------


def stdin_lines(loop, queue):
    """Lines of stdin into `queue` as they arrive, then None. A daemon thread: a read that blocks
    forever (a terminal, a silent pipe) never holds up the exit."""

    def read():
        for line in sys.stdin:
            loop.call_soon_threadsafe(queue.put_nowait, line)
        loop.call_soon_threadsafe(queue.put_nowait, None)

    threading.Thread(target=read, daemon=True, name="stdin").start()


# -- the session ------------------------------------------------------------------------------------


class Session:
    def __init__(self, args, fmt, out):
        self.args, self.fmt, self.out = args, fmt, out
        self.ws = None
        self.sent, self.sends, self.done_at, self.cursor = "", [], None, 0
        self.segment = None
        self.errors = 0
        self.interrupted = False
        self.audio_bytes = 0
        self.rate = None
        self.keepalive_s = 10.0

    def say(self, text):
        if not self.args.quiet:
            print(text, file=sys.stderr, flush=True)

    def error(self, text):
        self.errors += 1
        print(f"error: {text}", file=sys.stderr, flush=True)

    def config(self):
        session = {"response_format": self.fmt, "stream_audio": True}
        for field, value in (("voice", self.args.voice), ("sample_rate", self.args.rate), ("speed", self.args.speed)):
            if value is not None:
                session[field] = value
        if self.args.clause:
            session["split_granularity"] = "clause"
        if self.args.timestamps:
            session["timestamps"] = "word"
        return {"type": "session.config", "session": session}

    async def send_text(self, text):
        await self.ws.send(json.dumps({"type": "input.text", "text": text}))
        self.sent += text
        self.sends.append((len(self.sent), time.perf_counter()))

    async def feed(self):
        """The arguments at once, or stdin line by line; then input.done."""
        if self.args.text and self.args.text != ["-"]:
            await self.send_text(" ".join(self.args.text))
        else:
            queue = asyncio.Queue()
            stdin_lines(asyncio.get_running_loop(), queue)
            while True:
                try:  # a model that thinks for a while must not run into the server's idle timeout
                    line = await asyncio.wait_for(queue.get(), self.keepalive_s)
                except TimeoutError:
                    await self.ws.send(json.dumps({"type": "session.keepalive"}))
                    continue
                if line is None:
                    break
                await self.send_text(line)
        self.done_at = time.perf_counter()
        await self.ws.send(json.dumps({"type": "input.done"}))

    def completed_at(self, text):
        """When the frame that completed a segment went: the first one past its end, or input.done."""
        start = self.sent.find(text, self.cursor)
        if start < 0:
            return self.sends[-1][1] if self.sends else time.perf_counter()
        end = self.cursor = start + len(text)
        after = next((at for length, at in self.sends if length > end), None)
        return after or self.done_at or self.sends[-1][1]

    def on_event(self, event):
        kind = event.get("type")
        if kind == "session.configured":
            self.rate = event["sample_rate"]
            self.keepalive_s = event.get("limits", {}).get("idle_timeout_s", 30) / 3
            self.out.start(self.rate)
            self.say(
                f"session {event['session_id']}: engine {event['engine']}, voice {event['voice']}, "
                f"{event['response_format']} at {self.rate} Hz"
            )
        elif kind == "audio.start":
            self.segment = {
                "index": event["sentence_index"],
                "text": event["sentence_text"],
                "completed": self.completed_at(event["sentence_text"]),
                "first": None,
                "bytes": 0,
            }
        elif kind == "audio.timestamps":
            estimated = " (estimated)" if event.get("estimated") else ""
            for word in event["words"]:
                self.say(f"[{event['sentence_index']}] {word['start_ms']:6d} {word['end_ms']:6d} ms  {word['word']}{estimated}")
        elif kind == "audio.done":
            self.report(event)
        elif kind == "input.cancelled":
            self.say(f"cancelled: {event['cancelled_sentences']} segment(s) stopped or dropped")
            self.say(f"heard: {event['spoken_text']!r}; not heard: {event['unspoken_text']!r}")
        elif kind == "error":
            details = ", ".join(str(v) for v in (event.get("error_type"), event.get("code")) if v is not None)
            self.error(f"{event.get('message')} ({details})")

    def report(self, event):
        segment, self.segment = self.segment, None
        end = " cancelled" if event.get("cancelled") else " failed" if event.get("error") else ""
        if segment is None:  # a segment that failed before any audio
            self.say(f"[{event['sentence_index']}] no audio{end}")
            return
        first = ""
        if segment["first"] is not None:
            first = f"first audio {1000 * (segment['first'] - segment['completed']):.0f} ms, "
        seconds = (
            f"{segment['bytes'] / (2 if self.fmt == 'pcm' else 1) / self.rate:.2f} s"
            if self.fmt in RAW
            else f"{segment['bytes']} bytes"
        )
        self.say(f"[{segment['index']}] {segment['text']!r}: {first}{seconds}{end}")

    def on_audio(self, data):
        if self.segment is not None:
            if self.segment["first"] is None:
                self.segment["first"] = time.perf_counter()
            self.segment["bytes"] += len(data)
        self.audio_bytes += len(data)
        self.out.write(data)

    def interrupt(self, feeder):
        """Ctrl-C: stop sending, cancel what is being spoken, end the session; a second Ctrl-C closes at once."""
        if self.interrupted:
            asyncio.create_task(self.ws.close())
            return
        self.interrupted = True
        feeder.cancel()
        self.say("interrupted: cancelling")
        asyncio.create_task(self.ws.send(json.dumps({"type": "input.cancel"})))
        asyncio.get_running_loop().call_later(CANCEL_WAIT_S, lambda: asyncio.create_task(self.ws.close()))

    async def run(self):
        headers = {"Authorization": f"Bearer {self.args.key}"} if self.args.key else None
        url = ws_url(self.args.url)
        try:
            self.ws = await connect(url, additional_headers=headers, max_size=None, open_timeout=self.args.timeout)
        except InvalidStatus as exc:
            self.error(f"the server refused the connection to {url} (HTTP {exc.response.status_code})")
            return EXIT_CONNECT
        except (OSError, InvalidHandshake, TimeoutError) as exc:
            self.error(f"cannot connect to {url}: {exc.strerror if isinstance(exc, OSError) and exc.strerror else exc}")
            return EXIT_CONNECT
        loop = asyncio.get_running_loop()
        feeder = None
        try:
            try:
                await self.ws.send(json.dumps(self.config()))
            except ConnectionClosed:
                pass  # refused at once (key, capacity): the reason is among the frames already received
            async for message in self.ws:
                if isinstance(message, bytes):
                    self.on_audio(message)
                    continue
                event = json.loads(message)
                self.on_event(event)
                if event.get("type") == "session.configured":
                    feeder = asyncio.create_task(self.feed())
                    loop.add_signal_handler(signal.SIGINT, self.interrupt, feeder)
                elif event.get("type") == "input.cancelled" and self.interrupted:
                    await self.ws.send(json.dumps({"type": "input.done"}))
        except ConnectionClosed:
            pass
        finally:
            loop.remove_signal_handler(signal.SIGINT)
            if feeder is not None:
                feeder.cancel()
            await self.ws.close()
        code = self.ws.close_code
        if code not in (1000, None) and not self.errors and not self.interrupted:
            reason = f", {self.ws.close_reason}" if self.ws.close_reason else ""
            self.error(f"the server closed the connection (code {code}{reason})")
        if self.interrupted:
            return EXIT_INTERRUPTED
        return EXIT_SERVER if self.errors or code != 1000 else EXIT_OK


def ws_url(url):
    """ws(s)://HOST:PORT/v1/audio/speech/stream from a WebSocket or HTTP URL, with or without the path."""
    parts = urlsplit(url if "://" in url else f"ws://{url}")
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    return urlunsplit((scheme, parts.netloc, parts.path if parts.path not in ("", "/") else WS_PATH, parts.query, ""))


def parser():
    p = argparse.ArgumentParser(
        prog="python -m speech.client", description=__doc__.split("\n\n")[1], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("text", nargs="*", help="what to say; none (or -): stdin, line by line as it arrives")
    p.add_argument("-o", "--output", help="file to write (format from its extension); default: raw audio to stdout")
    p.add_argument(
        "--url",
        default=os.environ.get("SPEECH_URL", DEFAULT_URL),
        help=f"server WebSocket or base URL (env SPEECH_URL; default {DEFAULT_URL})",
    )
    p.add_argument("--key", default=os.environ.get("SPEECH_API_KEY"), help="API key (env SPEECH_API_KEY)")
    p.add_argument("--voice", help="a voice of the engine, or an uploaded one")
    p.add_argument(
        "--format",
        choices=("wav", "mp3", "opus", "aac", "pcm", "mulaw", "alaw", "flac"),
        help="audio format (default: from -o's extension, else pcm)",
    )
    p.add_argument("--rate", type=int, help="sample rate: 8000, 16000, 22050, 24000, 44100 or 48000")
    p.add_argument("--speed", type=float, help="0.25 to 4.0")
    p.add_argument("--clause", action="store_true", help="split at clauses (, ; :) as well as sentences")
    p.add_argument("--timestamps", action="store_true", help="print each word's start and end (ms) on stderr")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the connection (default 10)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr, errors only")
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    try:
        fmt, out = output_for(args)
    except (UsageError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    session = Session(args, fmt, out)
    try:
        code = asyncio.run(session.run())
    except KeyboardInterrupt:  # Ctrl-C before the session was open: nothing to cancel yet
        print("interrupted", file=sys.stderr)
        code = EXIT_INTERRUPTED
    except BrokenPipeError:  # the player reading stdout has gone: nothing more to do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nor at exit's flush
        code = EXIT_OK
    finally:
        try:
            out.close()
        except BrokenPipeError:
            pass
    if code in (EXIT_OK, EXIT_INTERRUPTED) and args.output:
        session.say(f"wrote {args.output}")
    return code


if __name__ == "__main__":
    sys.exit(main())
