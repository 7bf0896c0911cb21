"""What resampling and encoding cost, per second of audio, against what synthesising it costs.

    .venv/bin/python bench/audio_cost.py [--repeat 5] [--no-write] [--strict]

In this process (no server): about 20 s of real Hibari speech (`HibariEngine(workers=1)`, 24 kHz,
fixed seed) is synthesised once, sentence by sentence, timing the engine (synthesis time per second
of audio: the median of 3 passes after a warm-up). Then, for every format (8) and every contract
rate (6), each sentence goes the way the pipeline takes it (speech/stream/pipeline.py): a fresh
`Chain(24000, output_rate(fmt, rate))` per segment, `process` on each engine chunk then `flush`;
raw formats through a `RawEncoder` chunk by chunk, file formats as one `encode_file` per segment.
The cost is the median over `--repeat` passes, in ms per second of audio; "resample" is the chain
alone, "encode" the rest. Target: resampling + encoding under 10 % of the synthesis time of the same
audio (ratio < 0.10). Streamed mp3, opus and aac are timed too, the pipeline's way (one SessionEncoder
for the whole run): encoding under 15 % of the synthesis time (issue 43). Also the time-stretch
(atempo) of speeds 0.25 and 4.0, both as planned for the engine (`plan_speed` with its speed range;
Hibari's is 1.0-1.0, so atempo does all of it) and all by atempo from speed-1.0 audio, against the
synthesis time of the audio it stretches.

Writes/replaces the section "## Encoding and resampling cost (bench/audio_cost.py)" of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import statistics
import sys
import time
from pathlib import Path

import av
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from report import RESULTS, header, write_section  # noqa: E402

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ttsproject.settings")

import django  # noqa: E402

django.setup()

from speech.audio import streaming  # noqa: E402
from speech.audio.codecs import (  # noqa: E402
    FORMATS,
    OPUS_RATE,  # noqa: E402
    RAW_FORMATS,
    STREAMED_FORMATS,
    RawEncoder,
    encode_file,
    output_rate,
)
from speech.audio.signal import pcm16  # noqa: E402
from speech.audio.streaming import SessionEncoder  # noqa: E402
from speech.audio.transforms import Chain, plan_speed  # noqa: E402
from speech.engines.hibari import HibariEngine  # noqa: E402
from speech.stream.config import SAMPLE_RATES  # noqa: E402
from speech.stream.engine import SynthesisRequest  # noqa: E402
from speech.stream.frames import FIRST_FRAME_S, FRAME_S  # noqa: E402
from tests.support.streams import CONTAINERS  # noqa: E402

SECTION = "## Encoding and resampling cost (bench/audio_cost.py)"
TARGET_RATIO = 0.10
TARGET_STREAMED = 0.15  # streamed lossy encoding against synthesis time (issue 43)
SEED = 7
ENGINE_RATE = 24000

SENTENCES = [
    "The train leaves the station at seven in the morning.",
    "Please close the window before you go to bed tonight.",
    "My sister bought a red bicycle at the market last week.",
    "Could you send me the quarterly report by Friday afternoon?",
    "The coffee machine on the third floor is broken again.",
    "We walked along the beach until the sun went down behind the hills.",
    "Thank you for calling, how can I help you today?",
    "The library closes early on Sundays during the summer.",
]


# -- synthesis ---------------------------------------------------------------------------------------


async def synthesise(engine, speed=1.0, passes=3):
    """(segments, median synthesis seconds): segments = one list of engine chunks per sentence."""
    voice = engine.capabilities.default_voice
    timings, segments = [], None
    for _ in range(passes):
        run, started = [], time.perf_counter()
        for sentence in SENTENCES:
            chunks = [chunk async for chunk in engine.stream(SynthesisRequest(sentence, voice, speed, {"seed": SEED}))]
            run.append(chunks)
        timings.append(time.perf_counter() - started)
        segments = run
    return segments, statistics.median(timings)


def audio_seconds(segments, rate=ENGINE_RATE):
    return sum(chunk.size for chunks in segments for chunk in chunks) / rate


# -- the pipeline's work -----------------------------------------------------------------------------


def resample_only(segments, out_rate, stretch=1.0):
    out = 0
    for chunks in segments:
        chain = Chain(ENGINE_RATE, out_rate, stretch)
        for chunk in chunks:
            out += chain.process(chunk).size
        out += chain.flush().size
    return out


def resample_and_encode(segments, fmt, out_rate):
    total = 0
    for chunks in segments:
        chain = Chain(ENGINE_RATE, out_rate)
        if fmt in RAW_FORMATS:
            encoder = RawEncoder(fmt, out_rate)
            for chunk in chunks:
                total += len(encoder.encode(chunk if chain.identity else chain.process(chunk)))
            if not chain.identity:
                total += len(encoder.encode(chain.flush()))
        else:
            parts = [chunk if chain.identity else chain.process(chunk) for chunk in chunks]
            if not chain.identity:
                parts.append(chain.flush())
            total += len(encode_file(fmt, np.concatenate(parts), out_rate))
    return total


def resample_and_stream(segments, fmt, out_rate):
    """Streamed mp3/opus/aac the pipeline's way: one SessionEncoder for the whole run, each segment's
    audio fed FIRST_FRAME_S at a time until its first bytes come out, then FRAME_S at a time, then its tail."""
    encoder, total = SessionEncoder(fmt, out_rate), 0
    for chunks in segments:
        chain = Chain(ENGINE_RATE, out_rate)
        parts = [chunk if chain.identity else chain.process(chunk) for chunk in chunks]
        if not chain.identity:
            parts.append(chain.flush())
        samples, at, started = np.concatenate(parts), 0, False
        while at < samples.size:
            piece = samples[at : at + int(out_rate * (FRAME_S if started else FIRST_FRAME_S))]
            at += piece.size
            data = encoder.encode(piece)
            started = started or bool(data)
            total += len(data)
        total += len(encoder.end_segment())
    return total


BANDS_HZ = (7000, 11000)  # the fidelity is compared up to 7 kHz (every format keeps it), and up to 11 kHz
OPUS_SETTINGS = [  # libopus options over the streamed encoder's bit rate: the streamed encoder's, then alternatives
    {"application": "voip", "compression_level": "0"},
    {"application": "audio", "compression_level": "0"},
    {"application": "voip", "compression_level": "5"},
    {"application": "voip", "compression_level": "10"},
    {"application": "voip", "compression_level": "0", "cutoff": "8000"},  # wideband: SILK alone, 8 kHz audio
    {"application": "voip", "compression_level": "0", "frame_duration": "60"},
]


def fidelity(segments, fmt, out_rate):
    """(log-spectral distances in dB, one per BANDS_HZ, kbit/s) of one streamed session of `segments`
    decoded with FFmpeg, against the 16-bit samples it was made from: 20 ms frames holding sound (within
    50 dB of the loudest), each the RMS over frequency of the difference of the log power spectra,
    averaged. The segments line up sample for sample: each decodes to its samples and its zeros up to a
    whole codec frame. Up to 7 kHz the coding decides; up to 11 kHz (Hibari's audio reaches 12) the
    encoders' low-pass too."""
    encoder, data, references = SessionEncoder(fmt, out_rate), b"", []
    for chunks in segments:
        chain = Chain(ENGINE_RATE, out_rate)
        parts = [chunk if chain.identity else chain.process(chunk) for chunk in chunks]
        if not chain.identity:
            parts.append(chain.flush())
        samples = np.frombuffer(pcm16(np.concatenate(parts)), "<i2").astype(np.float32) / 32768
        data += encoder.encode(samples) + encoder.end_segment()
        padded = -(-samples.size // encoder.frame_size) * encoder.frame_size
        references.append(np.pad(samples, (0, padded - samples.size)))
    reference = np.concatenate(references)
    with av.open(io.BytesIO(data), format=CONTAINERS[fmt]) as container:
        decoded = np.concatenate([frame.to_ndarray().reshape(-1) for frame in container.decode(audio=0)])
    size = int(out_rate * 0.02)
    count = min(reference.size, decoded.size) // size
    spectra = [
        np.abs(np.fft.rfft(x[: count * size].reshape(count, size) * np.hanning(size), axis=1)) ** 2 for x in (reference, decoded)
    ]
    energy = spectra[0].sum(axis=1)
    loud = energy > energy.max() * 1e-5
    distances = []
    for top in BANDS_HZ:
        band = slice(1, int(top * size / out_rate) + 1)  # from 50 Hz (one bin)
        levels = [10 * np.log10(spectrum[:, band] + 1e-10) for spectrum in spectra]
        distances.append(float(np.sqrt(np.mean((levels[0][loud] - levels[1][loud]) ** 2, axis=1)).mean()))
    return distances, len(data) * 8 / (reference.size / out_rate) / 1000


def timed(repeat, fn, *args):
    fn(*args)  # warm (codec and filter set-up, caches)
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


# -- report ------------------------------------------------------------------------------------------


def verdict(ratio):
    return "PASS" if ratio < TARGET_RATIO else "FAIL"


async def run(repeat):
    engine = HibariEngine(workers=1)
    await engine.warm_up()
    segments, synth_s = await synthesise(engine)
    seconds = audio_seconds(segments)
    synth_ms = synth_s * 1000 / seconds  # per second of audio
    print(f"{seconds:.1f} s of speech in {len(segments)} segments; synthesis {synth_ms:.2f} ms per second of audio", flush=True)

    rows = []
    resample_cache = {}
    for fmt in FORMATS:
        for rate in SAMPLE_RATES:
            out_rate = output_rate(fmt, rate)
            if out_rate not in resample_cache:
                resample_cache[out_rate] = timed(repeat, resample_only, segments, out_rate)
            total = timed(repeat, resample_and_encode, segments, fmt, out_rate)
            resample_ms = resample_cache[out_rate] * 1000 / seconds
            total_ms = total * 1000 / seconds
            ratio = total_ms / synth_ms
            rows.append((fmt, rate, out_rate, resample_ms, max(0.0, total_ms - resample_ms), total_ms, ratio))
            print(
                f"{fmt:5s} {rate:5d} -> {out_rate:5d}: resample {resample_ms:6.2f}  total {total_ms:6.2f} ms/s  "
                f"ratio {ratio:5.2f}  {verdict(ratio)}",
                flush=True,
            )

    # Streamed mp3/opus/aac: one encoder a session (speech/audio/streaming.py), against TARGET_STREAMED.
    streamed_rows = []
    for fmt in STREAMED_FORMATS:
        for rate in SAMPLE_RATES:
            out_rate = output_rate(fmt, rate)
            if fmt == "opus" and rate != out_rate:
                continue  # always 48 kHz: one row
            total = timed(repeat, resample_and_stream, segments, fmt, out_rate)
            resample_ms = resample_cache[out_rate] * 1000 / seconds
            total_ms = total * 1000 / seconds
            encode_ms = max(0.0, total_ms - resample_ms)
            streamed_rows.append((fmt, out_rate, resample_ms, encode_ms, total_ms, encode_ms / synth_ms))
            print(f"streamed {fmt:4s} {out_rate:5d}: encode {encode_ms:6.2f} ms/s  ratio {encode_ms / synth_ms:5.2f}", flush=True)

    # Opus settings: cost and fidelity of the streamed encoder's and the alternatives, one run.
    opus_rows = []
    chosen = streaming.ENCODERS["opus"]
    try:
        for options in OPUS_SETTINGS:
            streaming.ENCODERS["opus"] = (chosen[0], options, chosen[2])
            streaming._priming.clear()  # frame size and priming as these options make them
            cost = (
                timed(repeat, resample_and_stream, segments, "opus", OPUS_RATE) * 1000 / seconds
                - resample_cache[OPUS_RATE] * 1000 / seconds
            )
            distance, kbps = fidelity(segments, "opus", OPUS_RATE)
            label = ", ".join(f"{name}={value}" for name, value in options.items())
            opus_rows.append((label, max(0.0, cost), cost / synth_ms, distance, kbps))
            print(f"opus {label}: encode {cost:.2f} ms/s, log-spectral distances {distance} dB", flush=True)
    finally:
        streaming.ENCODERS["opus"] = chosen
        streaming._priming.clear()
    for fmt, rate in (("mp3", 24000), ("aac", 24000)):
        distance, kbps = fidelity(segments, fmt, rate)
        opus_rows.append((f"{fmt} at {rate} Hz (as streamed)", None, None, distance, kbps))

    # Time-stretch. The engine's plan (plan_speed over its speed range), then all-atempo from speed 1.0 audio.
    stretch_rows = []
    for speed in (0.25, 4.0):
        engine_speed, stretch = plan_speed(speed, engine.capabilities.speed_range)
        native, native_synth_s = await synthesise(engine, engine_speed)
        for label, source, source_synth_s, factor in (
            (f"Hibari plan: engine {engine_speed:g} + atempo {stretch:g}", native, native_synth_s, stretch),
            (f"all atempo {speed:g} (engine 1.0)", segments, synth_s, speed),
        ):
            cost = timed(repeat, resample_only, source, ENGINE_RATE, factor)
            out_seconds = resample_only(source, ENGINE_RATE, factor) / ENGINE_RATE
            ratio = cost / source_synth_s
            stretch_rows.append(
                (
                    speed,
                    label,
                    audio_seconds(source),
                    out_seconds,
                    cost * 1000 / out_seconds,
                    source_synth_s * 1000 / out_seconds,
                    ratio,
                )
            )
            print(
                f"speed {speed:g} {label}: {cost * 1000 / out_seconds:.2f} ms per output second, ratio {ratio:.2f} "
                f"{verdict(ratio)}",
                flush=True,
            )
    await engine.aclose()
    return seconds, len(segments), synth_ms, rows, streamed_rows, opus_rows, stretch_rows


def streamed_table(streamed_rows):
    table = [
        "| streamed format | rate | resample ms/s | encode ms/s | total ms/s | encode / synthesis | verdict |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for fmt, rate, resample_ms, encode_ms, total_ms, ratio in streamed_rows:
        verdict_text = "PASS" if ratio < TARGET_STREAMED else "FAIL"
        table.append(f"| {fmt} | {rate} | {resample_ms:.2f} | {encode_ms:.2f} | {total_ms:.2f} | {ratio:.3f} | {verdict_text} |")
    return "\n".join(table)


def opus_table(opus_rows):
    table = [
        "| encoder | encode ms/s | encode / synthesis | log-spectral distance dB, to 7 kHz | to 11 kHz | kbit/s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for label, cost, ratio, distance, kbps in opus_rows:
        cost_text = "" if cost is None else f"{cost:.2f}"
        ratio_text = "" if ratio is None else f"{ratio:.3f}"
        table.append(f"| {label} | {cost_text} | {ratio_text} | {distance[0]:.2f} | {distance[1]:.2f} | {kbps:.0f} |")
    return "\n".join(table)


def tables(rows, stretch_rows):
    main = [
        "| format | rate asked | rate out | resample ms/s | encode ms/s | total ms/s | cost / synthesis | verdict |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for fmt, rate, out_rate, resample_ms, encode_ms, total_ms, ratio in rows:
        main.append(
            f"| {fmt} | {rate} | {out_rate} | {resample_ms:.2f} | {encode_ms:.2f} | {total_ms:.2f} | "
            f"{ratio:.3f} | {verdict(ratio)} |"
        )
    stretch = [
        "| speed | how | input s | output s | stretch ms per output s | synthesis ms per output s | cost / synthesis | verdict |",
        "|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for speed, label, in_s, out_s, cost_ms, synth_ms, ratio in stretch_rows:
        stretch.append(
            f"| {speed:g} | {label} | {in_s:.1f} | {out_s:.1f} | {cost_ms:.2f} | {synth_ms:.2f} | "
            f"{ratio:.3f} | {verdict(ratio)} |"
        )
    return "\n".join(main), "\n".join(stretch)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="timed passes per row (median reported)")
    parser.add_argument("--no-write", action="store_true", help="do not touch bench/RESULTS.md")
    parser.add_argument("--strict", action="store_true", help="exit with status 1 when a row misses the target")
    args = parser.parse_args(argv)
    command = "python bench/audio_cost.py" + (f" --repeat {args.repeat}" if args.repeat != 5 else "")

    seconds, count, synth_ms, rows, streamed_rows, opus_rows, stretch_rows = asyncio.run(run(args.repeat))
    main_table, stretch_table = tables(rows, stretch_rows)
    streamed = streamed_table(streamed_rows)
    streamed_failed = [f"{fmt}@{rate}" for fmt, rate, *_, ratio in streamed_rows if ratio >= TARGET_STREAMED]
    failed = [(fmt, rate) for fmt, rate, *_, ratio in rows if ratio >= TARGET_RATIO]
    failed_formats = sorted({fmt for fmt, _ in failed})
    passed = len(rows) - len(failed)
    stretch_failed = [row for row in stretch_rows if row[-1] >= TARGET_RATIO]
    print()
    print(main_table)
    print()
    print(streamed)
    print()
    print(opus_table(opus_rows))
    print()
    print(stretch_table)

    summary = (
        f"{passed} of {len(rows)} format/rate rows under {TARGET_RATIO:.0%} of synthesis time"
        + (f"; over it: {', '.join(failed_formats)} (" + ", ".join(f"{f}@{r}" for f, r in failed) + ")" if failed else "")
        + ". "
        + f"Time-stretch: {len(stretch_rows) - len(stretch_failed)} of {len(stretch_rows)} rows under target."
    )
    section = "\n".join(
        [
            *header(SECTION, command),
            f"* {seconds:.1f} s of Hibari speech ({count} sentences, seed {SEED}, 24 kHz) synthesised in-process by "
            f"`HibariEngine(workers=1)`: **{synth_ms:.2f} ms of synthesis per second of audio** (median of 3 passes, "
            "after warm-up). Each row runs every segment the pipeline's way: `Chain(24000, output_rate)` per segment "
            "(`process` per engine chunk, then `flush`), then `RawEncoder` chunk by chunk (pcm, mulaw, alaw) or one "
            f"`encode_file` per segment; median of {args.repeat} passes, in ms per second of audio. resample = the "
            "chain alone, encode = total - resample. Target: total under "
            f"{TARGET_RATIO:.0%} of the synthesis time of the same audio (cost / synthesis < {TARGET_RATIO:.2f}).",
            "",
            main_table,
            "",
            "Streamed mp3, opus and aac (`stream_audio: true`): one `SessionEncoder` for the whole run, each segment fed "
            "as the pipeline feeds it (40 ms pieces until its first bytes, then 200 ms, then its tail; "
            "speech/audio/streaming.py's settings), the encoder alone (the resampling as above). Target: encoding "
            f"under {TARGET_STREAMED:.0%} of the synthesis time of the same audio.",
            "",
            streamed,
            "",
            "Opus settings, one session of the same speech each (the first row is the streamed encoder's): the "
            "encoder's cost as above, and the log-spectral distance of the decoded stream to the 16-bit samples it "
            "was made from (20 ms frames holding sound, RMS over 50 Hz-7 kHz, and 50 Hz-11 kHz, of the difference of "
            "log power spectra, averaged; lower is closer), with mp3 and aac for comparison:",
            "",
            opus_table(opus_rows),
            "",
            f"Streamed: {len(streamed_rows) - len(streamed_failed)} of {len(streamed_rows)} rows under "
            f"{TARGET_STREAMED:.0%}" + (f"; over it: {', '.join(streamed_failed)}." if streamed_failed else "."),
            "",
            "Time-stretch (FFmpeg atempo via `Chain(24000, 24000, stretch)`), against the synthesis time of the audio "
            "it stretches, per second of output:",
            "",
            stretch_table,
            "",
            f"Verdict: {summary}",
            "",
        ]
    )
    if not args.no_write:
        write_section(SECTION, section)
        print(f"\nwrote {RESULTS.relative_to(ROOT)}")
    return 1 if args.strict and (failed or stretch_failed) else 0


if __name__ == "__main__":
    sys.exit(main())
