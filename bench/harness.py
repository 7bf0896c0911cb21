"""What the socket benchmarks share (bench/ttfa.py, bench/hangup.py, bench/streamed.py): their daphne,
and the time from the text frame that completes a segment to its first audio frame; and the other
checkout that bench/compare.py, bench/firstwords.py and bench/rest_first_audio.py run beside this one.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
import time
from pathlib import Path

from tests.support.live import DaphneServer, recv_item

HIBARI = {"SPEECH_ENGINE": "hibari", "SPEECH_REQUIRE_API_KEY": "false"}


@contextlib.contextmanager
def hibari_server(env=None, port=None):
    """One daphne (`manage.py serve`, tests/support/live.py) with the Hibari engine and no API keys,
    `env` added; stopped at the end, and a traceback in its log fails the benchmark."""
    server = DaphneServer({**HIBARI, **(env or {})}, port=port).start()
    try:
        yield server
    finally:
        server.stop()
    if "Traceback" in server.stderr_text():
        print(server.stderr_text()[-4000:], file=sys.stderr)
        raise SystemExit("the server logged a traceback during the benchmark")
    server.cleanup()


def parse_with_other(parser, argv=None):
    """`parser`'s arguments and a first one, `other`: a checkout of this repository (the code before a
    change), whose server the benchmark runs beside this checkout's."""
    parser.add_argument("other", type=Path, help="a checkout of this repository: the code before a change")
    args = parser.parse_args(argv)
    if not (args.other / "manage.py").is_file():
        parser.error(f"{args.other} is not a checkout of this repository (no manage.py)")
    return args


def split_final_mark(sentence):
    """("The train leaves the station at seven", ". ") — the second part completes the segment."""
    match = re.fullmatch(r"(.*?)([.!?]+)", sentence)
    assert match, sentence
    return match.group(1), match.group(2) + " "


async def first_audio(ws, sentence):
    """Send `sentence` on a configured session as two input.text frames, its final mark last: (seconds
    from that last frame to the first binary frame, the audio.start before it). Only audio.start may
    come before the audio."""
    body, tail = split_final_mark(sentence)
    await ws.send(json.dumps({"type": "input.text", "text": body}))
    last = json.dumps({"type": "input.text", "text": tail})  # serialised before t0
    t0 = time.perf_counter()
    await ws.send(last)
    start = None
    while (item := await recv_item(ws)).kind != "audio":
        assert item.data["type"] == "audio.start", item.data
        start = item.data
    return item.at - t0, start
