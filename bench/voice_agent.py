"""Voice-agent extensions over real sockets: what was heard, turns queued and cancelled, and what
word timestamps cost.

    .venv/bin/python bench/voice_agent.py [--trials 200] [--no-write] [--strict]

One daphne (`manage.py serve`, engine Hibari), one reused WebSocket session per part.

(1) Heard: the client plays in real time (each frame from its arrival, waiting through gaps, as the
    server's own estimate assumes) and cancels at a random moment, half the trials with `played_ms`
    (its own playback clock), half without (the server's estimate). The truth is the words whose
    end, counted from the utterance's first sample with the segments' delivered lengths, was reached
    by the client's clock. Target: the words of `spoken_text` are exactly those in >= 98 % of trials.
(2) A turn queued behind a playing one: context A (one sentence) and B (one sentence) sent at once,
    each finished with `input.done`; from A's last binary frame to B's first. Target: p50 <= 20 ms.
(3) Cancel of one context among three, the speaking one or a queued one in turn: frames of it
    after `input.cancelled` (target 0 in every trial), and the other two whole.
(4) Cost of timestamps: rounds of 4 concurrent paragraph sessions, timestamps on and off
    alternating; audio seconds per wall second and first audio. Target: on within 3 % of off.

Writes/replaces the section "## Voice-agent extensions (bench/voice_agent.py)" of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness import hibari_server  # noqa: E402
from report import RESULTS, header, write_section  # noqa: E402

from tests.support.live import configure, open_session, recv_item, send_json  # noqa: E402

SECTION = "## Voice-agent extensions (bench/voice_agent.py)"
RATE = 24000
SENTENCES = [
    "The train leaves the station at 7:15 and arrives in Boston shortly after nine.",
    "Dr. Patel said the results, all 1,250 of them, would be ready by Friday.",
    "Please close the window before you go to bed, because the night will be cold.",
    "My sister bought a red bicycle for $349.99 last week and rides it every morning.",
    "Could you send me the report by 3 p.m. so that I can read it over the weekend?",
    "We walked along the beach until the sun went down behind the old lighthouse.",
    "Thank you for calling Acme Corp., how can I help you today with your order?",
    "The museum opens at ten and closes at six, except on Mondays when it stays closed.",
]
PARAGRAPH = " ".join(SENTENCES[:5])


def pct(values, q):
    return float(statistics.quantiles(values, n=100, method="inclusive")[q - 1]) if len(values) > 1 else values[0]


class Player:
    """A client that plays each frame from its arrival, waiting through gaps, and knows each word's
    place in the utterance from `audio.timestamps`."""

    def __init__(self):
        self.played_out_at = 0.0
        self.sent_ms = 0.0
        self.segments = []  # [text, words, offset_ms, length_ms]

    def on_item(self, item):
        if item.kind == "audio":
            seconds = len(item.data) / 2 / RATE
            self.played_out_at = max(self.played_out_at, item.at) + seconds
            self.sent_ms += seconds * 1000
            self.segments[-1][3] += seconds * 1000
        elif item.data["type"] == "audio.start":
            self.segments.append([item.data["sentence_text"], [], self.sent_ms, 0.0])
        elif item.data["type"] == "audio.timestamps":
            self.segments[-1][1].extend(item.data["words"])

    def played_ms(self, now):
        return max(0.0, self.sent_ms - 1000 * max(0.0, self.played_out_at - now))

    def heard_words(self, played_ms):
        heard = []
        for text, words, offset, _ in self.segments:
            for word in words:
                if offset + word["end_ms"] > played_ms:
                    return heard
                heard.append(text[word["char_start"] : word["char_end"]])
        return heard


def words_of(text):
    return [word.strip(".,;:!?\"'()") for word in text.split() if word.strip(".,;:!?\"'()")]


class Trial:
    """What the session's one reader task tells the trial under way: its first frame and its answer."""

    def __init__(self):
        self.player = Player()
        self.first = asyncio.get_running_loop().create_future()
        self.told = asyncio.get_running_loop().create_future()


async def pump(ws, trials):
    """Read the session for its whole life, handing each item to the trial under way (the last one of
    `trials`). A read is never cancelled: in Python 3.11 a cancelled `wait_for` can lose the message it
    had just received."""
    while True:
        item = await recv_item(ws)
        trial = trials[-1]
        if item.kind == "event" and item.data["type"] == "error":
            raise RuntimeError(f"the server answered {item.data}")
        trial.player.on_item(item)
        if item.kind == "audio" and not trial.first.done():
            trial.first.set_result(item.at)
        elif item.kind == "event" and item.data["type"] == "input.cancelled":
            trial.told.set_result(item.data)


async def heard_trials(url, trials, rng):
    ws = await open_session(url)
    results, under_way = [], []
    reader = None
    try:
        await configure(ws, {"response_format": "pcm", "stream_audio": True, "timestamps": "word"})
        reader = asyncio.create_task(pump(ws, under_way))
        for number in range(trials):
            trial = Trial()
            under_way.append(trial)
            text = " ".join(SENTENCES[(number + i) % len(SENTENCES)] for i in range(3))
            await send_json(ws, {"type": "input.text", "text": text + " "})
            first = await asyncio.wait_for(asyncio.shield(trial.first), 30)
            await asyncio.sleep(max(0.0, first + rng.uniform(0.05, 3.0) - time.perf_counter()))
            client = number % 2 == 0
            played = trial.player.played_ms(time.perf_counter())
            message = {"type": "input.cancel", **({"played_ms": round(played, 1)} if client else {})}
            await send_json(ws, message)
            told = await asyncio.wait_for(asyncio.shield(trial.told), 30)
            truth = trial.player.heard_words(told["played_ms"] if client else played)
            spoken = words_of(told["spoken_text"])
            results.append(
                {
                    "client": client,
                    "exact": spoken == truth,
                    "off_by": abs(len(spoken) - len(truth)),
                    "estimate_error_ms": None if client else told["played_ms"] - played,
                }
            )
            under_way[:] = [trial]  # the player keeps no earlier trial
        await send_json(ws, {"type": "input.done"})
    finally:
        if reader is not None:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
        await ws.close()
    return results


LEAD_S = 0.25  # the real-time reader keeps this much audio in hand, as a player's jitter buffer would


async def queued_trials(url, trials):
    """(gap, arrival gap) per trial: B's first frame against the end of A's playback, and against A's
    last frame's arrival, for a client that reads in real time (small socket buffers, LEAD_S in hand)."""
    ws = await open_session(url, small_buffers=True)
    gaps = []
    try:
        await configure(ws, {"response_format": "pcm", "stream_audio": True})
        for trial in range(trials):
            a, b = f"a{trial}", f"b{trial}"
            for context, sentence in ((a, SENTENCES[trial % 8]), (b, SENTENCES[(trial + 3) % 8])):
                await send_json(ws, {"type": "input.text", "text": sentence + " ", "context_id": context})
                await send_json(ws, {"type": "input.done", "context_id": context})
            last_a = first_b = None
            owner, played_out_at = None, 0.0
            while first_b is None:
                item = await recv_item(ws)
                if item.kind == "event" and item.data["type"] == "audio.start":
                    owner = item.data["context_id"]
                elif item.kind == "audio":
                    if owner == b:
                        first_b = item.at
                        break
                    last_a = item.at
                    played_out_at = max(played_out_at, item.at) + len(item.data) / 2 / RATE
                    await asyncio.sleep(max(0.0, played_out_at - LEAD_S - time.perf_counter()))
            gaps.append(((first_b - played_out_at) * 1000, (first_b - last_a) * 1000))
            while True:
                item = await recv_item(ws)
                if item.kind == "event" and item.data["type"] == "context.done" and item.data["context_id"] == b:
                    break
        await send_json(ws, {"type": "input.done"})
    finally:
        await ws.close()
    return gaps


async def context_cancel_trials(url, trials, rng):
    ws = await open_session(url)
    results = []
    try:
        await configure(ws, {"response_format": "pcm", "stream_audio": True})
        for trial in range(trials):
            names = [f"t{trial}-{n}" for n in range(3)]
            for n, name in enumerate(names):
                text = " ".join(SENTENCES[(trial + n + i) % 8] for i in range(2))
                await send_json(ws, {"type": "input.text", "text": text + " ", "context_id": name})
                await send_json(ws, {"type": "input.done", "context_id": name})
            victim = names[0] if trial % 2 == 0 else names[rng.randint(1, 2)]
            frames_before = rng.randint(1, 6)
            owner, seen = None, 0
            bytes_of = {name: 0 for name in names}
            while seen < frames_before:
                item = await recv_item(ws)
                if item.kind == "event" and item.data["type"] == "audio.start":
                    owner = item.data["context_id"]
                    bytes_of[owner] = 0
                elif item.kind == "audio":
                    seen += 1
                    bytes_of[owner] += len(item.data)
            await send_json(ws, {"type": "input.cancel", "context_id": victim})
            after_cancel, stale, done, whole = False, 0, set(), True
            while len(done) < 2 or not after_cancel:
                item = await recv_item(ws)
                if item.kind == "audio":
                    bytes_of[owner] += len(item.data)
                    stale += after_cancel and owner == victim
                    continue
                event = item.data
                if event["type"] == "audio.start":
                    owner = event["context_id"]
                    bytes_of[owner] = 0
                elif event["type"] == "audio.done" and event["context_id"] != victim:
                    whole &= not event["cancelled"] and event["total_bytes"] == bytes_of[owner]
                elif event["type"] == "input.cancelled":
                    after_cancel = True
                elif event["type"] == "context.done":
                    done.add(event["context_id"])
            results.append({"stale": stale, "whole": whole and done == set(names) - {victim}, "speaking": victim == names[0]})
        await send_json(ws, {"type": "input.done"})
    finally:
        await ws.close()
    return results


async def paragraph(url, timestamps):
    ws = await open_session(url)
    try:
        await configure(ws, {"response_format": "pcm", "stream_audio": True, **({"timestamps": "word"} if timestamps else {})})
        sent = time.perf_counter()
        await send_json(ws, {"type": "input.text", "text": PARAGRAPH})
        await send_json(ws, {"type": "input.done"})
        first, audio = None, 0
        while True:
            item = await recv_item(ws)
            if item.kind == "audio":
                first = first or item.at
                audio += len(item.data)
            elif item.data["type"] == "session.done":
                return first - sent, audio / 2 / RATE, item.at
    finally:
        await ws.close()


async def cost_rounds(url, rounds, concurrency=4):
    data = {True: {"rate": [], "first": []}, False: {"rate": [], "first": []}}
    for round_ in range(rounds * 2):
        timestamps = round_ % 2 == (round_ // 2) % 2  # on/off, off/on, ...: neither side always first
        started = time.perf_counter()
        results = await asyncio.gather(*(paragraph(url, timestamps) for _ in range(concurrency)))
        wall = max(end for _, _, end in results) - started
        data[timestamps]["rate"].append(sum(audio for _, audio, _ in results) / wall)
        data[timestamps]["first"].extend(first * 1000 for first, _, _ in results)
    return data


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=200, help="heard trials; half as many for the other parts")
    parser.add_argument("--rounds", type=int, default=12, help="cost rounds of each kind")
    parser.add_argument("--no-write", action="store_true", help="do not touch bench/RESULTS.md")
    parser.add_argument("--strict", action="store_true", help="exit with status 1 when a target is missed")
    args = parser.parse_args(argv)
    rng = random.Random(1)
    started = time.monotonic()
    with hibari_server() as server:
        heard = asyncio.run(heard_trials(server.ws_url, args.trials, rng))
        print(f"heard: {len(heard)} trials", flush=True)
        gaps = asyncio.run(queued_trials(server.ws_url, max(10, args.trials // 8)))
        print(f"queued: {len(gaps)} trials", flush=True)
        cancels = asyncio.run(context_cancel_trials(server.ws_url, max(20, args.trials // 2), rng))
        print(f"context cancels: {len(cancels)} trials", flush=True)
        cost = asyncio.run(cost_rounds(server.ws_url, args.rounds))
    elapsed = time.monotonic() - started

    rows, verdicts = [], []
    for client in (True, False):
        group = [t for t in heard if t["client"] is client]
        exact = sum(t["exact"] for t in group)
        ok = exact >= 0.98 * len(group)
        verdicts.append(ok)
        label = "with played_ms" if client else "server's estimate"
        extra = ""
        if not client:
            errors = [t["estimate_error_ms"] for t in group]
            extra = f"; estimate − client clock p50 {pct(errors, 50):+.1f} ms, p95 {pct([abs(e) for e in errors], 95):.1f} ms"
        rows.append(
            f"| heard words exact, {label} | {exact}/{len(group)} ({100 * exact / len(group):.1f} %), "
            f"off by one word at most in {sum(t['off_by'] <= 1 for t in group)}{extra} | ≥ 98 % | {'PASS' if ok else 'FAIL'} |"
        )
    silence = [max(0.0, gap) for gap, _ in gaps]
    arrival = [arrival for _, arrival in gaps]
    gap_p50 = pct(silence, 50)
    verdicts.append(gap_p50 <= 20)
    rows.append(
        f"| queued turn: silence between A's playback end and B's first frame, p50 / p90 / max | {gap_p50:.1f} / "
        f"{pct(silence, 90):.1f} / {max(silence):.1f} ms ({len(gaps)} trials; B's first frame came "
        f"{-pct([g for g, _ in gaps], 50):.0f} ms before A's end at p50, {pct(arrival, 50):.1f} ms after A's last frame) "
        f"| p50 ≤ 20 ms | {'PASS' if gap_p50 <= 20 else 'FAIL'} |"
    )
    clean = sum(t["stale"] == 0 for t in cancels)
    whole = sum(t["whole"] for t in cancels)
    ok = clean == len(cancels) and whole == len(cancels)
    verdicts.append(ok)
    rows.append(
        f"| one context of three cancelled: no frame of it after input.cancelled / the others whole | "
        f"{clean}/{len(cancels)} / {whole}/{len(cancels)} (speaking one cut in {sum(t['speaking'] for t in cancels)}) "
        f"| all | {'PASS' if ok else 'FAIL'} |"
    )
    on, off = cost[True], cost[False]
    rate_ratio = statistics.median(on["rate"]) / statistics.median(off["rate"])
    first_ratio = statistics.median(on["first"]) / statistics.median(off["first"])
    ok = rate_ratio >= 0.97 and first_ratio <= 1.03
    verdicts.append(ok)
    rows.append(
        f"| timestamps on / off at C = 4: audio per wall second, first audio p50 | {rate_ratio:.3f}, {first_ratio:.3f} "
        f"({statistics.median(on['rate']):.1f} / {statistics.median(off['rate']):.1f} audio s per s; "
        f"{statistics.median(on['first']):.1f} / {statistics.median(off['first']):.1f} ms) "
        f"| within 3 % | {'PASS' if ok else 'FAIL'} |"
    )
    table = "\n".join(["| figure | measured | target | verdict |", "|---|---|---|---|", *rows])
    print(table)
    command = "python bench/voice_agent.py" + (f" --trials {args.trials}" if args.trials != 200 else "")
    section = "\n".join(
        [
            *header(SECTION, command),
            f"* Run time: {elapsed:.0f} s; one daphne, engine Hibari, pcm streamed at 24 kHz.",
            "* Heard: the client plays each frame from its arrival and cancels 0.05-3 s after the first frame of a "
            "three-sentence utterance; the truth is the words whose end its own clock reached.",
            f"* Cost: {args.rounds} rounds each of 4 concurrent five-sentence sessions, on and off alternating.",
            "",
            table,
            "",
        ]
    )
    if not args.no_write:
        write_section(SECTION, section)
        print(f"\nwrote {RESULTS.relative_to(ROOT)}")
    return 1 if args.strict and not all(verdicts) else 0


if __name__ == "__main__":
    sys.exit(main())
