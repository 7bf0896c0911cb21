"""The Pipecat service's targets (issue 44), in the integrations' virtualenv:

    .venv-integrations/bin/python bench/pipecat_agent.py [--rounds 20] [--interruptions 50]

1. First audio: from a turn's text frame reaching the service in a Pipecat pipeline (the harness
   of integrations/pipecat/tests: Pipecat's output transport playing in real time) to its first
   audio frame leaving the service for the transport, against a bare WebSocket client sending the
   same text on a session of its own (send to first binary frame), rounds interleaved on one
   daphne. Target: Pipecat's p50 within 5 ms of the bare p50.
2. Interruptions at random moments (uniform in 0.2-3 s of played audio): stale frames (audio of the
   interrupted turn reaching the transport after the interruption did; target 0) and how often the
   assistant context aggregator's text equals the words heard (those whose end, by the server's word
   timestamps, the transport had played when the interruption reached it: it plays at its sample
   rate from the start of the turn's audio; target >= 98 %).

Writes its section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "integrations" / "pipecat" / "tests"), str(ROOT / "bench")]

from harness import Bot  # noqa: E402
from pipecat.frames.frames import InterruptionFrame, LLMTextFrame, OutputAudioRawFrame, TTSAudioRawFrame  # noqa: E402
from report import header, write_section  # noqa: E402
from websockets.asyncio.client import connect  # noqa: E402

from tests.support.live import DaphneServer  # noqa: E402

HEADING = "## Pipecat service (bench/pipecat_agent.py)"
SERVER_PYTHON = ROOT / ".venv" / "bin" / "python"
TEXT = "Hello there, how are you doing today?"
LONG = (
    "Once upon a time there was a little robot who liked to count the stars in the sky. "
    "Every night it climbed the tallest hill in the valley and counted until the sun came up. "
    "One morning it found a star that had fallen into the river, and it carried the star all the way home."
)


def words(text: str) -> list[str]:
    return re.findall(r"[\w']+", text.lower())


async def pipecat_first_audio(bot: Bot) -> tuple[float, float]:
    """From the turn's text frame reaching the service to its first audio frame leaving it; and the
    service's own share of that (before its text goes out, after its first audio comes in)."""
    began = bot.now()
    await bot.say([TEXT])
    context_id = await bot.into.wait_for(bot.first_audio_context(after=began))
    text = next(s.at for s in bot.text.seen if s.at >= began and isinstance(s.frame, LLMTextFrame))
    first = bot.into.of(TTSAudioRawFrame, context_id)[0].at
    await bot.played.wait_for(bot.turn_done(context_id))
    own = (bot.tts.sent_at[context_id] - text) + (first - bot.tts.heard_at[context_id])
    return first - text, own


async def bare_first_audio(ws, round_index: int) -> float:
    context = f"bare-{round_index}"
    began = time.perf_counter()
    await ws.send(json.dumps({"type": "input.text", "text": TEXT, "context_id": context}))
    await ws.send(json.dumps({"type": "input.done", "context_id": context}))
    first = None
    async for message in ws:
        if isinstance(message, bytes):
            first = first or time.perf_counter()
        elif json.loads(message)["type"] == "context.done":
            return first - began
    raise RuntimeError("the session ended")


async def first_audio(url: str, rounds: int) -> tuple[list[float], list[float], list[float]]:
    pipecat, bare, own = [], [], []
    async with Bot(url) as bot, connect(url) as ws:
        config = {"response_format": "pcm", "stream_audio": True, "sample_rate": 24000, "timestamps": "word"}
        await ws.send(json.dumps({"type": "session.config", "session": config}))
        await ws.recv()
        for i in range(rounds + 1):  # the first round of each warms up and is dropped
            if i % 2 == 0:  # alternate which goes first
                (a, service), b = await pipecat_first_audio(bot), await bare_first_audio(ws, i)
            else:
                b, (a, service) = await bare_first_audio(ws, i), await pipecat_first_audio(bot)
            if i:
                pipecat.append(a)
                bare.append(b)
                own.append(service)
    return pipecat, bare, own


def played_audio_after(began: float):
    """When the transport first played audio after `began` (a wait_for predicate)."""
    return lambda seen: next((s.at for s in seen if s.at >= began and isinstance(s.frame, OutputAudioRawFrame)), None)


def heard_words(bot: Bot, context_id: str, played_s: float) -> list[str]:
    """The turn's words whose end the transport had played, by the server's timestamps."""
    heard, offset_s = [], 0.0
    for segment in bot.tts.segments.get(context_id, []):
        heard += [w["word"] for w in segment["words"] if offset_s + w["end_ms"] / 1000 <= played_s]
        offset_s += segment["audio_bytes"] / (2 * 24000)
    return [w.lower() for w in heard]


async def interruptions(url: str, count: int, seed: int) -> dict:
    rng = random.Random(seed)
    stale = equal = server_equal = 0
    lags = []  # from the service's first audio frame to the transport playing it
    async with Bot(url) as bot:
        for _ in range(count):
            began = bot.now()
            await bot.say([LONG])
            context_id = await bot.into.wait_for(bot.first_audio_context(after=began))
            at = rng.uniform(0.2, 3.0)
            first_played = await bot.played.wait_for(played_audio_after(began))
            await asyncio.sleep(max(0.0, first_played + at - bot.now()))
            turns = len(bot.turns)
            await bot.interrupt()
            cancelled = await bot.wait_cancelled(context_id)
            [*_, turn] = await bot.wait_turns(turns + 1)
            into_cut = next(i for i, s in enumerate(bot.into.seen) if s.at >= began and isinstance(s.frame, InterruptionFrame))
            stale += sum(
                isinstance(s.frame, TTSAudioRawFrame) and s.frame.context_id == context_id for s in bot.into.seen[into_cut:]
            )
            # the audio heard: the transport plays at its sample rate from the turn's first audio
            transport = bot.transport
            run_start = min(t for t in transport.runs if t >= began)
            played_s = transport.interrupted_at[-1] - run_start
            lags.append(run_start - bot.into.of(TTSAudioRawFrame, context_id)[0].at)
            heard = heard_words(bot, context_id, played_s)
            equal += words(turn.content) == heard
            server_equal += words(turn.content) == words(cancelled["spoken_text"])
    return {"count": count, "stale": stale, "equal": equal, "server_equal": server_equal, "lags": lags}


def p(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] * 1000 if q < 100 else max(values) * 1000


async def main(args: argparse.Namespace) -> None:
    with DaphneServer({"SPEECH_ENGINE": "hibari"}, python=str(SERVER_PYTHON)) as server:
        pipecat, bare, own = await first_audio(server.ws_url, args.rounds)
        cuts = await interruptions(server.ws_url, args.interruptions, args.seed)
    server.cleanup()
    gap = p(pipecat, 50) - p(bare, 50)
    lines = header(
        HEADING,
        f".venv-integrations/bin/python bench/pipecat_agent.py --rounds {args.rounds} "
        f"--interruptions {args.interruptions} --seed {args.seed}",
    )
    lines += [
        "",
        f"First audio, text frame into the service -> first audio frame out of it, {args.rounds} interleaved rounds "
        f'("{TEXT}", Hibari):',
        "",
        "| client | p50 ms | p90 ms | max ms |",
        "|---|---|---|---|",
        f"| Pipecat pipeline | {p(pipecat, 50):.1f} | {p(pipecat, 90):.1f} | {p(pipecat, 100):.1f} |",
        f"| bare WebSocket client | {p(bare, 50):.1f} | {p(bare, 90):.1f} | {p(bare, 100):.1f} |",
        "",
        f"Pipecat p50 - bare p50: {gap:+.1f} ms (target <= 5 ms: {'met' if gap <= 5 else 'NOT met'}). The "
        f"service's own share of the Pipecat time (text frame in -> its text sent, plus its first audio "
        f"received -> that frame out): p50 {p(own, 50):.1f} ms, p90 {p(own, 90):.1f} ms; the rest is the "
        "server's answer, the same work as for the bare client.",
        "",
        f"Interruptions at random moments (0.2-3 s of played audio, seed {args.seed}): {cuts['count']} rounds, "
        f"{cuts['stale']} stale audio frames after the interruption (target 0: {'met' if cuts['stale'] == 0 else 'NOT met'}); "
        f"aggregator text = words heard in {cuts['equal']}/{cuts['count']} "
        f"({100 * cuts['equal'] / cuts['count']:.0f} %, target >= 98 %: "
        f"{'met' if cuts['equal'] >= 0.98 * cuts['count'] else 'NOT met'}); "
        f"= the server's spoken_text in {cuts['server_equal']}/{cuts['count']}. From the service's first audio "
        f"frame to the transport playing it: p50 {p(cuts['lags'], 50):.1f} ms, p90 {p(cuts['lags'], 90):.1f} ms, "
        f"max {p(cuts['lags'], 100):.1f} ms. The service times words from when it expects the transport to play "
        "(the median of the last 20 lags): a word ending within the lag's deviation from that median is in the "
        "context but not yet heard, or heard but not yet in it.",
    ]
    print("\n".join(lines))
    write_section(HEADING, "\n".join(lines) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--interruptions", type=int, default=50)
    parser.add_argument("--seed", type=int, default=44)
    asyncio.run(main(parser.parse_args()))
