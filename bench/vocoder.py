"""Hibari's vocoder as this engine runs it (speech/engines/hibari_vocoder.py) against Hibari's own.

    .venv/bin/python bench/vocoder.py [--repeats 30] [--no-write]

In this process, one thread: for sentences of bench/ttfa.py, the model's run once, then the thread CPU
of `hibari.dsp.synth` (fresh Gaussian noise for every bin of every frame) and of one `Vocoder` push (the
same samples but for the noise, read from the process's table), interleaved; and of a whole part as the
engine renders it (`synthesise`: model and vocoder) against the model and `dsp.synth`. Reported: the
medians and their ratio per sentence, and the noise's share of `dsp.synth`.

Writes/replaces the section "## Hibari's vocoder (bench/vocoder.py)" of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from report import header, write_section  # noqa: E402
from ttfa import SENTENCES  # noqa: E402

SECTION = "## Hibari's vocoder (bench/vocoder.py)"


def cpu_ms(fn):
    start = time.thread_time()
    fn()
    return (time.thread_time() - start) * 1000


def measure(tts, text, repeats):
    """(characters, frames, {what: median thread CPU ms}) for one sentence."""
    from hibari import dsp

    from speech.engines.hibari_align import synthesise
    from speech.engines.hibari_vocoder import Vocoder

    ids = tts.ids(tts.phonemize(text)[0])
    feeds = {"ids": np.asarray([ids], np.int64), "speed": np.asarray([1.0], np.float32)}
    params = [o[0] for o in tts.sess.run(None, feeds)[:6]]
    bins, frames = params[0].shape
    rng = np.random.default_rng(0)
    times = {"synth": [], "push": [], "noise": [], "hibari": [], "engine": []}
    for _ in range(repeats):
        times["synth"].append(cpu_ms(lambda: dsp.synth(*params, rng)))
        times["push"].append(cpu_ms(lambda: Vocoder(np.random.default_rng(0)).push(params, final=True)))
        times["noise"].append(cpu_ms(lambda: rng.standard_normal((bins, 2 * frames), dtype=np.float32)))
        times["hibari"].append(cpu_ms(lambda: dsp.synth(*(o[0] for o in tts.sess.run(None, feeds)[:6]), rng)))
        times["engine"].append(cpu_ms(lambda: synthesise(tts.sess, ids, 1.0, np.random.default_rng(0))))
    return len(text), frames, {name: float(np.median(values)) for name, values in times.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--no-write", action="store_true", help="do not touch bench/RESULTS.md")
    args = parser.parse_args(argv)

    from hibari.voices import DEFAULT

    from speech.engines.hibari import load_voice
    from speech.engines.hibari_vocoder import noise_table

    noise_table()
    tts = load_voice(DEFAULT)
    sentences = sorted(SENTENCES, key=len)
    picked = [sentences[0], sentences[len(sentences) // 2], sentences[-1]]
    rows = [measure(tts, text, args.repeats) for text in picked]

    lines = [
        *header(SECTION, "python bench/vocoder.py"),
        f"* In process, one thread, {args.repeats} interleaved repeats per sentence; thread CPU medians (ms).",
        "",
        "| sentence (chars, frames) | `dsp.synth` | its noise | one `Vocoder` push | push / synth "
        "| model + `dsp.synth` | `synthesise` (model + push) | ratio |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for chars, frames, m in rows:
        lines.append(
            f"| {chars}, {frames} | {m['synth']:.2f} | {m['noise']:.2f} ({m['noise'] / m['synth']:.0%}) | "
            f"{m['push']:.2f} | {m['push'] / m['synth']:.3f} | {m['hibari']:.2f} | {m['engine']:.2f} | "
            f"{m['engine'] / m['hibari']:.3f} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        write_section(SECTION, text)


if __name__ == "__main__":
    sys.exit(main())
