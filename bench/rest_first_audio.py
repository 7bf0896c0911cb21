"""First audio of a streamed `POST /v1/audio/speech`: this checkout against another, interleaved.

    .venv/bin/python bench/rest_first_audio.py OTHER_CHECKOUT [--rounds 5] [--no-write]

OTHER_CHECKOUT is the code before a change (`git worktree add /tmp/before main`), run on this
checkout's Python and packages. Two daphnes (`manage.py serve`, engine Hibari, no API keys), each
asked on a kept-alive HTTP connection of its own for `"stream": true`, pcm: bench/ttfa.py's sentences
of 32-115 characters and bench/throughput.py's paragraph, one request at a time, the two servers
alternating request by request (the first of each pair rotating by round). First audio = from the
request's send to the first byte of its body (the server answers once it has audio: the headers come
with it); last = to the end of the body. A sentence's figure is its median over the rounds; the
ratio, this / other, is of the medians over sentences, with a bootstrap interval over the rounds
(bench/report.py's `interval`). 3 warm-up requests a server are not counted.

Writes the section "## Streamed REST first audio (bench/rest_first_audio.py)" of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness import parse_with_other  # noqa: E402
from report import header, interval, write_section  # noqa: E402
from throughput import PARAGRAPH  # noqa: E402
from ttfa import SENTENCES  # noqa: E402

from tests.support.live import DaphneServer  # noqa: E402

SECTION = "## Streamed REST first audio (bench/rest_first_audio.py)"
ENV = {"SPEECH_ENGINE": "hibari", "SPEECH_REQUIRE_API_KEY": "false"}
WARM_UP = 3
RATE = 24000
TIMEOUT_S = 60


def speak(conn, text):
    """(seconds to the body's first byte, seconds to its end, bytes) of one streamed request."""
    body = json.dumps({"input": text, "response_format": "pcm", "stream": True})
    t0 = time.perf_counter()
    conn.request("POST", "/v1/audio/speech", body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200, (response.status, response.read()[:300])
    first = response.read1(65536)
    t1 = time.perf_counter()
    size = len(first) + len(response.read())
    return t1 - t0, time.perf_counter() - t0, size


def rounds(other_root, texts, count):
    """{side: [[(first, last, bytes) per text] per round]}."""
    seen = {"other": [], "this": []}
    with DaphneServer(ENV, root=other_root) as other, DaphneServer(ENV) as this:
        conns = {
            side: http.client.HTTPConnection(server.host, server.port, timeout=TIMEOUT_S)
            for side, server in (("other", other), ("this", this))
        }
        for conn in conns.values():
            for text in texts[:WARM_UP]:
                speak(conn, text)
        for r in range(count):
            for side in seen:
                seen[side].append([])
            for t, text in enumerate(texts):
                for side in ("other", "this") if (r + t) % 2 == 0 else ("this", "other"):
                    seen[side][-1].append(speak(conns[side], text))
            print(f"round {r + 1}/{count}", flush=True)
        for conn in conns.values():
            conn.close()
        other.assert_no_traceback()
        this.assert_no_traceback()
    return seen


def report(seen, texts, count):
    """Lines of the section: medians over texts of each text's median over rounds, both servers."""
    data = {side: np.asarray(runs) for side, runs in seen.items()}  # rounds x texts x (first, last, bytes)
    lines = [
        "| requests | first audio p50 ms, other / this | this / other (90 % interval) "
        "| last audio p50 ms, other / this | length this - other, largest |",
        "|---|---|---|---|---|",
    ]
    kinds = (("one sentence of 32-115 characters", slice(0, len(texts) - 1)), ("the paragraph", slice(len(texts) - 1, None)))
    for label, which in kinds:

        def ratio(indexes, which=which, column=0):
            other, this = (np.median(np.median(data[s][indexes, which, column], axis=0)) for s in ("other", "this"))
            return this / other

        first = {s: np.median(np.median(data[s][:, which, 0], axis=0)) * 1000 for s in data}
        last = {s: np.median(np.median(data[s][:, which, 1], axis=0)) * 1000 for s in data}
        low, high = interval(ratio, count)
        # Pieces trim their sentence's silences in 10 ms steps, so its length may move by a step or two.
        apart = data["this"][:, which, 2] - data["other"][:, which, 2]
        apart_ms = float(apart.flat[np.argmax(np.abs(apart))]) / 2 / RATE * 1000
        lines.append(
            f"| {label} | {first['other']:.1f} / {first['this']:.1f} | {ratio(np.arange(count)):.3f} "
            f"({low:.3f}-{high:.3f}) | {last['other']:.1f} / {last['this']:.1f} | {apart_ms:+.0f} ms |"
        )
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-write", action="store_true")
    args = parse_with_other(parser)
    texts = [s for s in SENTENCES if 32 <= len(s) <= 115] + [PARAGRAPH]
    started = time.monotonic()
    seen = rounds(args.other, texts, args.rounds)
    lines = [
        f"* Run time: {time.monotonic() - started:.0f} s. Other: the code before (`{args.other}`). "
        f"{len(texts) - 1} sentences and the paragraph, {args.rounds} rounds; " + __doc__.split("\n\n")[2].replace("\n", " "),
        "",
        *report(seen, texts, args.rounds),
    ]
    print("\n".join(lines))
    if not args.no_write:
        command = f".venv/bin/python bench/rest_first_audio.py {args.other} --rounds {args.rounds}"
        write_section(SECTION, "\n".join([*header(SECTION, command), *lines]) + "\n")


if __name__ == "__main__":
    main()
