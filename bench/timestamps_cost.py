"""What word timings cost Hibari, for bench/timestamps.py: CPU per audio second with timestamps off and
on, `hibari_align.alignment` against rendering, and the engine's text path against `Hibari.phonemize`."""

from __future__ import annotations

import time

import numpy as np

from speech.audio.signal import sound_bounds, trim_bounds
from speech.engines.hibari_align import alignment, synthesise
from speech.engines.hibari_words import plan
from speech.engines.text import for_number_reader

RATE = 24000


async def cost(speak, engine, texts, rounds):
    """CPU seconds per audio second, timestamps off and on, in alternating rounds (`speak` as
    bench/timestamps.py's)."""
    per = {False: [], True: []}
    for r in range(rounds):
        for timestamps in (r % 2 == 0, r % 2 == 1):
            cpu, audio = time.process_time(), 0
            for index, text in enumerate(texts):
                samples, _ = await speak(engine, text, seed=index, timestamps=timestamps)
                audio += samples.size
            per[timestamps].append((time.process_time() - cpu) / (audio / RATE))
    return per


def align_cost(engine, texts, repeat=20):
    """CPU ms of `hibari_align.alignment` per sentence (each timed `repeat` times over), against the CPU
    of rendering the same sentences (model and vocoder): the work timestamps add to a segment."""
    tts = engine._models[engine.capabilities.default_voice]
    rng = np.random.default_rng(0)
    render = align = 0.0
    parts = 0
    for text in texts:
        planned = plan(tts, text)
        for part in planned.parts:
            cpu = time.process_time()
            raw, steps = synthesise(tts.sess, part.ids, 1.0, rng)
            sound = sound_bounds(raw, RATE)
            kept = trim_bounds(sound, raw.size, RATE)
            render += time.process_time() - cpu
            cpu = time.process_time()
            for _ in range(repeat):
                alignment(planned, part, steps, kept, sound, 0, RATE)
            align += (time.process_time() - cpu) / repeat
            parts += 1
    return align * 1000 / parts, render * 1000 / parts


def text_cost(tts, texts, rounds):
    """CPU ms per sentence of the engine's text path (`plan`: Hibari's, traced) against
    `Hibari.phonemize` alone, in alternating rounds."""
    per = {"phonemize": [], "plan": []}
    for r in range(rounds):
        for name in ("phonemize", "plan") if r % 2 == 0 else ("plan", "phonemize"):
            cpu = time.process_time()
            for text in texts:
                plan(tts, text) if name == "plan" else tts.phonemize(for_number_reader(text))
            per[name].append((time.process_time() - cpu) * 1000 / len(texts))
    return per
