"""The cost of the pydantic wire vocabulary (speech/stream/events.py) per event: audio.start and
audio.done (one each per segment, never per frame) built and serialised as the consumer sends them,
against the dict literals they replaced; and reading a session.config.

    .venv/bin/python bench/events.py [--number N] [--no-write]
"""

import argparse
import json
import sys
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from report import RESULTS, header, write_section  # noqa: E402

from speech.engines.fake import FakeEngine  # noqa: E402
from speech.stream.events import AudioDone, AudioStart  # noqa: E402
from speech.stream.wire import parse_config  # noqa: E402

SECTION = "## Wire vocabulary: building and serialising events"
SEGMENT_ID = "speech_ws_0123456789abcdef0123456789abcdef-3"
CAPS = FakeEngine().capabilities


def encode(event):
    return json.dumps(event, ensure_ascii=False, separators=(",", ":"))  # as the consumer's encode_json


def done_literal():
    return encode(
        {"type": "audio.done", "id": SEGMENT_ID, "sentence_index": 3, "total_bytes": 48000, "error": False, "cancelled": False}
    )


def done_model():
    return encode(AudioDone(id=SEGMENT_ID, sentence_index=3, total_bytes=48000, error=False, cancelled=False).dump())


def start_literal():
    return encode(
        {
            "type": "audio.start",
            "id": SEGMENT_ID,
            "sentence_index": 3,
            "sentence_text": "Hello there.",
            "format": "pcm",
            "sample_rate": 24000,
        }
    )


def start_model():
    return encode(
        AudioStart(id=SEGMENT_ID, sentence_index=3, sentence_text="Hello there.", format="pcm", sample_rate=24000).dump()
    )


def read_config():
    return parse_config(
        {"type": "session.config", "session": {"voice": "alt", "response_format": "pcm", "speed": 1.25, "stream_audio": True}},
        CAPS,
    )


def per_call_us(function, number):
    return min(timeit.repeat(function, number=number, repeat=5)) / number * 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=50000, help="calls per timing (best of 5)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave bench/RESULTS.md alone")
    args = parser.parse_args()
    assert done_literal() == done_model() and start_literal() == start_model()  # the same bytes on the wire
    rows = [
        ("audio.done, dict literal + json.dumps", per_call_us(done_literal, args.number)),
        ("audio.done, AudioDone(...).dump() + json.dumps", per_call_us(done_model, args.number)),
        ("audio.start, dict literal + json.dumps", per_call_us(start_literal, args.number)),
        ("audio.start, AudioStart(...).dump() + json.dumps", per_call_us(start_model, args.number)),
        ("session.config read (parse_config, nested, 4 fields)", per_call_us(read_config, args.number // 5)),
    ]
    table = "\n".join(["| what | µs per call |", "|---|---|", *(f"| {what} | {us:.2f} |" for what, us in rows)])
    print(table)
    command = "python bench/events.py" + (f" --number {args.number}" if args.number != 50000 else "")
    section = "\n".join(
        [
            *header(SECTION, command),
            "* Best of 5 timeit runs, in-process; one audio.start and one audio.done per segment.",
            "",
            table,
            "",
        ]
    )
    if not args.no_write:
        write_section(SECTION, section)
        print(f"\nwrote {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
