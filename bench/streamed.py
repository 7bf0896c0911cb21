"""Streamed mp3, opus and aac against pcm, over real sockets: first audio and decoded length.

    .venv/bin/python bench/streamed.py [--rounds 30] [--beside-rounds 12] [--only-beside] [--no-write] [--strict]

Starts one daphne (`manage.py serve`, engine Hibari, tests/support/live.py). Every round speaks the
same three-sentence text (fixed seed) in one session per format, pcm, mp3, opus and aac, all with
`stream_audio: true`, in rotating order, plus a pcm session at 48 kHz (opus' rate) for its length.
First audio: from the text frame to the session's first binary frame. Length: every binary frame of
the session, concatenated and decoded with FFmpeg (PyAV), against the pcm session's samples at the
same rate; the contract allows less than one codec frame per segment.

Load: 4 sessions at once speak the same text, pcm, mp3 and opus in rotating order; the wall time to the
last session's end, paired against pcm's (what encoding costs the server's throughput).

Beside: whether encoding is off the synthesis cores' critical path. Two pcm sessions speak beside two
sessions of pcm, mp3 or opus (the neighbours' format rotating, round by round), the same text at once
(at saturation the three texts, below it one):
the pcm sessions' wall time to their end, paired against the round whose neighbours are pcm, is what
the neighbours' encoding costs synthesis. What it costs the neighbours themselves: their wall time and
first audio against pcm neighbours', and their stall (how long a player starting at the first audio
would have waited for audio, beyond real time). At saturation every session sends its text at once;
below it, each sends one sentence every BELOW_GAP_S.

Targets: the first audio of streamed mp3 and opus within 10 ms of pcm's (the median of the differences
paired within a round; their p90 is reported, but on a shared machine it measures the machine); every
round's decoded length within one codec frame per segment of pcm's.

Writes/replaces the section "## Streamed compressed audio (bench/streamed.py)" of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import struct
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness import hibari_server  # noqa: E402
from report import RESULTS, header, write_section  # noqa: E402

from speech.audio.streaming import SessionEncoder  # noqa: E402
from tests.support.live import collect, configure, open_session, recv_item, send_json  # noqa: E402
from tests.support.streams import assert_whole_frames, decoded_samples, mp3_frame_length  # noqa: E402

SECTION = "## Streamed compressed audio (bench/streamed.py)"
TARGET_FIRST_AUDIO_MS = 10.0
WARM_UP = 3
SEED = 3
TEXTS = [
    "The train leaves at seven. It arrives in the city shortly after nine. Please be on time. ",
    "Thank you for calling. How can I help you today? I will look at your order. ",
    "The museum opens at ten. It closes at six, except on Mondays. The café stays open later. ",
]
FORMATS = {"pcm": 24000, "mp3": 24000, "opus": 48000, "aac": 24000}
LOAD_SESSIONS = 4  # sessions at once in the load part
BESIDE = ("pcm", "mp3", "opus")  # the neighbours' formats in the beside part
BELOW_GAP_S = 1.0  # below saturation: one sentence a second, about half its audio


async def speak(url, fmt, rate, text):
    """(first audio seconds, binary frames, segments) of one session speaking `text`."""
    ws = await open_session(url)
    try:
        await configure(ws, {"response_format": fmt, "stream_audio": True, "sample_rate": rate, "seed": SEED})
        t0 = time.perf_counter()
        await send_json(ws, {"type": "input.text", "text": text})
        while (item := await recv_item(ws)).kind != "audio":
            pass
        first = item.at - t0
        await send_json(ws, {"type": "input.done"})
        rest = await collect(ws)
    finally:
        await ws.close()
    items = [item, *rest.items]
    frames = [i.data for i in items if i.kind == "audio"]
    segments = sum(1 for i in items if i.kind == "event" and i.data["type"] == "audio.done")
    return first, frames, segments


async def rounds(url, count):
    first = {fmt: [] for fmt in FORMATS}
    lengths = {fmt: [] for fmt in FORMATS if fmt != "pcm"}  # (decoded - pcm, segments, bytes, seconds)
    names = list(FORMATS)
    for n in range(WARM_UP + count):
        text = TEXTS[n % len(TEXTS)]
        made = {}
        for fmt in names[n % len(names) :] + names[: n % len(names)]:
            made[fmt] = await speak(url, fmt, FORMATS[fmt], text)
        pcm48 = await speak(url, "pcm", 48000, text)
        if n < WARM_UP:
            continue
        pcm_samples = {24000: sum(map(len, made["pcm"][1])) // 2, 48000: sum(map(len, pcm48[1])) // 2}
        for fmt, (seconds, frames, segments) in made.items():
            first[fmt].append(seconds)
            if fmt == "pcm":
                continue
            assert_whole_frames(frames, fmt)
            rate = FORMATS[fmt]
            data = b"".join(frames)
            lengths[fmt].append((decoded_samples(data, fmt) - pcm_samples[rate], segments, len(data), pcm_samples[rate] / rate))
        if (n - WARM_UP + 1) % 10 == 0:
            print(f"  {n - WARM_UP + 1}/{count} rounds", flush=True)
    return first, lengths


async def together(url, fmt, text, sessions):
    """Seconds from `sessions` sessions' text (sent at once) to the last one's session end."""
    started = time.perf_counter()
    await asyncio.gather(*(speak(url, fmt, FORMATS[fmt], text) for _ in range(sessions)))
    return time.perf_counter() - started


async def load_rounds(url, count, sessions):
    """Paired ratios, mp3 / pcm and opus / pcm, of the wall time `sessions` sessions at once take to speak
    the same text (same audio), rounds in rotating order."""
    ratios = {"mp3": [], "opus": []}
    names = ["pcm", "mp3", "opus"]
    for n in range(WARM_UP + count):
        text = TEXTS[n % len(TEXTS)]
        wall = {}
        for fmt in names[n % 3 :] + names[: n % 3]:
            wall[fmt] = await together(url, fmt, text, sessions)
        if n >= WARM_UP:
            for fmt in ratios:
                ratios[fmt].append(wall[fmt] / wall["pcm"])
    return ratios


def played(frames, fmt, rate):
    """Seconds of audio up to the end of each binary frame: pcm by its bytes, mp3 by its frames (MPEG-2
    layer III at 24 kHz: 576 samples each), opus by its last page's granule position (48 kHz)."""
    done, total = [], 0.0
    for frame in frames:
        if fmt == "pcm":
            total += len(frame) / 2 / rate
        elif fmt == "mp3":
            count, at = 0, 0
            while at < len(frame):
                at += mp3_frame_length(frame[at : at + 4])
                count += 1
            total += count * 576 / rate
        else:
            total = max(total, max(struct.unpack_from("<q", frame, at + 6)[0] for at in page_starts(frame)) / 48000)
        done.append(total)
    return done


def page_starts(frame):
    starts, at = [], 0
    while at < len(frame):
        starts.append(at)
        count = frame[at + 26]
        at += 27 + count + sum(frame[at + 27 : at + 27 + count])
    return starts


async def listen(url, fmt, text, gap):
    """(first audio, stall, end) in seconds of one session speaking `text`, its sentences sent `gap` apart
    (at once if 0), from its first text frame; stall: how long a player that starts at the first audio
    waits for audio on the way."""
    ws = await open_session(url)
    try:
        await configure(ws, {"response_format": fmt, "stream_audio": True, "sample_rate": FORMATS[fmt], "seed": SEED})
        sentences = re.findall(r"[^.?!]+[.?!]+\s*", text) if gap else [text]
        t0 = time.perf_counter()

        async def send():
            for n, sentence in enumerate(sentences):
                if n:
                    await asyncio.sleep(gap)
                await send_json(ws, {"type": "input.text", "text": sentence})
            await send_json(ws, {"type": "input.done"})

        sender = asyncio.create_task(send())
        result = await collect(ws)
        await sender
    finally:
        await ws.close()
    audio = [item for item in result.items if item.kind == "audio"]
    first = audio[0].at
    seconds = played([item.data for item in audio], fmt, FORMATS[fmt])
    stall = max(0.0, *(item.at - first - before for item, before in zip(audio, [0.0, *seconds[:-1]])))
    return first - t0, stall, result.items[-1].at - t0


async def beside_rounds(url, count, gap):
    """Per neighbours' format: lists of (pcm wall, pcm first audio, neighbours' wall, first audio, stall)
    per round; two pcm sessions and two neighbours at once, the neighbours' format rotating."""
    runs = {fmt: [] for fmt in BESIDE}
    for n in range(WARM_UP + count):
        # At saturation all three texts (longer sessions: steadier wall times), below it one.
        text = TEXTS[n % len(TEXTS)] if gap else "".join(TEXTS[n % len(TEXTS) :] + TEXTS[: n % len(TEXTS)])
        for fmt in BESIDE[n % 3 :] + BESIDE[: n % 3]:
            pcm, other = await asyncio.gather(
                asyncio.gather(*(listen(url, "pcm", text, gap) for _ in range(2))),
                asyncio.gather(*(listen(url, fmt, text, gap) for _ in range(2))),
            )
            if n >= WARM_UP:
                runs[fmt].append(
                    (
                        max(end for _, _, end in pcm),
                        np.mean([first for first, _, _ in pcm]),
                        max(end for _, _, end in other),
                        np.mean([first for first, _, _ in other]),
                        max(stall for _, stall, _ in other),
                    )
                )
    return runs


def beside_table(runs):
    """Rows of the beside part: each format's figures paired with the pcm-neighbours' round."""
    base = np.asarray(runs["pcm"])
    rows = [
        "| neighbours | pcm sessions' wall time, x beside pcm (p50, p10-p90) | pcm first audio, ms paired (p50) | "
        "neighbours' wall time, x pcm's (p50, p10-p90) | neighbours' first audio, ms paired (p50 / p90) | "
        "neighbours' stall ms (p50 / p90 / max) |",
        "|---|---|---|---|---|---|",
    ]
    for fmt in BESIDE:
        run = np.asarray(runs[fmt])
        pcm_wall, other_wall = run[:, 0] / base[:, 0], run[:, 2] / base[:, 2]
        pcm_first, other_first, stall = (run[:, 1] - base[:, 1]) * 1000, (run[:, 3] - base[:, 3]) * 1000, run[:, 4] * 1000
        rows.append(
            f"| {fmt} | {np.median(pcm_wall):.3f} ({np.percentile(pcm_wall, 10):.3f}-{np.percentile(pcm_wall, 90):.3f}) | "
            f"{np.median(pcm_first):+.1f} | {np.median(other_wall):.3f} ({np.percentile(other_wall, 10):.3f}-"
            f"{np.percentile(other_wall, 90):.3f}) | {np.median(other_first):+.1f} / {np.percentile(other_first, 90):+.1f} | "
            f"{np.median(stall):.0f} / {np.percentile(stall, 90):.0f} / {stall.max():.0f} |"
        )
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--beside-rounds", type=int, default=12, help="rounds of the beside part, at and below saturation")
    parser.add_argument("--only-beside", action="store_true", help="the beside part alone, printed (RESULTS.md untouched)")
    parser.add_argument("--no-write", action="store_true", help="do not touch bench/RESULTS.md")
    parser.add_argument("--strict", action="store_true", help="exit with status 1 when a target is missed")
    args = parser.parse_args(argv)
    command = "python bench/streamed.py" + (f" --rounds {args.rounds}" if args.rounds != 30 else "")
    command += f" --beside-rounds {args.beside_rounds}" if args.beside_rounds != 12 else ""
    started = time.monotonic()
    with hibari_server() as server:
        beside = {
            "at saturation (text at once)": asyncio.run(beside_rounds(server.ws_url, args.beside_rounds, 0.0)),
            f"below saturation (a sentence every {BELOW_GAP_S:g} s)": asyncio.run(
                beside_rounds(server.ws_url, args.beside_rounds, BELOW_GAP_S)
            ),
        }
        beside_lines = []
        for regime, runs in beside.items():
            beside_lines += ["", f"Beside, {regime}, {args.beside_rounds} rounds:", "", *beside_table(runs)]
        print("\n".join(beside_lines), flush=True)
        if args.only_beside:
            return 0
        first, lengths = asyncio.run(rounds(server.ws_url, args.rounds))
        load = asyncio.run(load_rounds(server.ws_url, args.rounds // 2, LOAD_SESSIONS))

    pcm = np.asarray(first["pcm"]) * 1000
    rows = [
        "| format | first audio p50 ms | p90 ms | paired difference to pcm p50 / p90 ms | decoded - pcm, samples (max) | "
        "codec frame | worst frames per segment | kbit/s |",
        "|---|---|---|---|---|---|---|---|",
        f"| pcm | {np.percentile(pcm, 50):.1f} | {np.percentile(pcm, 90):.1f} | | | | | {16 * 24:.0f} |",
    ]
    verdicts = []
    for fmt, rate in FORMATS.items():
        if fmt == "pcm":
            continue
        ms = np.asarray(first[fmt]) * 1000
        diff = ms - pcm
        frame = SessionEncoder(fmt, rate).frame_size
        extra = [d for d, _, _, _ in lengths[fmt]]
        worst = max(d / segments / frame for d, segments, _, _ in lengths[fmt])
        kbps = np.median([8 * size / seconds / 1000 for _, _, size, seconds in lengths[fmt]])
        paired = f"{np.percentile(diff, 50):+.1f} / {np.percentile(diff, 90):+.1f}"
        rows.append(
            f"| {fmt} | {np.percentile(ms, 50):.1f} | {np.percentile(ms, 90):.1f} | {paired} | {max(extra)} | {frame} | "
            f"{worst:.2f} | {kbps:.0f} |"
        )
        length_ok = min(extra) >= 0 and worst < 1
        verdicts.append(f"{fmt} length {'PASS' if length_ok else 'FAIL'}")
        if fmt in ("mp3", "opus"):
            ok = np.percentile(diff, 50) <= TARGET_FIRST_AUDIO_MS
            verdicts.append(f"{fmt} first audio {'PASS' if ok else 'FAIL'}")
    verdict_line = "Verdict: " + ", ".join(f"**{v}**" for v in verdicts) + "."
    load_line = (
        f"* Load: {LOAD_SESSIONS} sessions at once speak the same text, pcm, mp3 and opus in rotating order, "
        f"{args.rounds // 2} rounds: wall time to the last session's end, paired against pcm's, median "
        + ", ".join(
            f"{fmt} {np.median(values):.3f}x (p10-p90 {np.percentile(values, 10):.3f}-{np.percentile(values, 90):.3f})"
            for fmt, values in load.items()
        )
        + " (encoding off the event loop, at the lowest priority while the listener has audio ahead, speech/audio/codecs.py)."
    )
    print("\n".join(rows), "", verdict_line, load_line, sep="\n")
    section = "\n".join(
        [
            *header(SECTION, command),
            f"* Run time: {time.monotonic() - started:.0f} s",
            f"* One daphne (engine Hibari); {args.rounds} rounds after {WARM_UP} warm-up rounds, each the same "
            "three-sentence text (seed fixed) in one session per format (pcm, mp3 and aac at 24 kHz, opus at 48 kHz, "
            "all `stream_audio: true`) in rotating order, and a pcm session at 48 kHz. First audio: the text frame "
            "to the first binary frame; the differences are paired within a round. Length: every binary frame of the "
            "session decoded with FFmpeg (PyAV) as one stream, minus the pcm session's samples at the same rate; "
            "every binary frame held whole codec frames (checked). Targets: mp3 and opus first audio within "
            f"{TARGET_FIRST_AUDIO_MS:g} ms of pcm's (median of the paired differences); decoded length within one codec "
            "frame per segment of pcm's (worst round).",
            "",
            *rows,
            "",
            verdict_line,
            "",
            load_line,
            "",
            "* Beside: two pcm sessions and two neighbours (pcm, mp3 or opus, rotating) speak the same text at once "
            "(at saturation all three texts, below it one); paired with the round whose neighbours are pcm: the pcm "
            "sessions' wall time to their end (what the neighbours' encoding costs synthesis: 1.0 or less when it is "
            "off the synthesis cores' critical path) and first audio; the neighbours' own wall time and first audio; "
            "their stall: how long a player starting at their first audio waits for audio on the way (the worst of "
            "the two).",
            *beside_lines,
            "",
        ]
    )
    if not args.no_write:
        write_section(SECTION, section)
        print(f"\nwrote {RESULTS.relative_to(ROOT)}")
    return 1 if args.strict and "FAIL" in verdict_line else 0


if __name__ == "__main__":
    sys.exit(main())
