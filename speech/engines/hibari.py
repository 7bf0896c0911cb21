"""Hibari: the embedded engine. Real neural speech on the CPU, weights inside its wheel.

Facts this relies on (docs/engines.md, Hibari): 24 kHz float32 output (quantised to 16 bits on the
synthesis thread when the request asks for it), one array per sentence,
a lazily loaded G2P (warmed up here), ~0.3 s of leading and ~0.5 s of
trailing near-silence per sentence (trimmed) and quiet output (normalised). onnxruntime releases
the GIL, so a small pool of threads, one intra-op thread each, uses the cores.

Word timings are the model's own phoneme durations (speech.engines.hibari_align), mapped to the words
of the request's text through Hibari's text path (speech.engines.hibari_words), which this engine
runs instead of `Hibari.phonemize` (the same phonemes) whether timings are asked for or not.

When the listener waits with no audio (`SynthesisRequest.first_words`), a segment's first sentence
comes in two pieces, the first sent before the rest is rendered (speech.engines.hibari_pieces).
"""

from __future__ import annotations

import itertools
import logging
import os
import tempfile
from dataclasses import replace

import numpy as np

from ..audio import signal as audio
from . import hibari_words
from ..stream.engine import Alignment, Capabilities, Engine, EngineError, SynthesisRequest, WordTiming
from ..stream.meter import NO_METER
from .hibari_align import alignment, model_with_durations, synthesise
from .hibari_pieces import Pieces, split_model
from .hibari_vocoder import noise_table
from .pool import JobAbandoned, SynthesisPool, release_point
from .stopping import StoppableSession

logger = logging.getLogger(__name__)

FAILED_MESSAGE = "speech synthesis failed"
CALIBRATION = (
    "The train leaves the station at seven.",
    "Could you send me the report by Friday afternoon?",
    "We walked along the beach until the sun went down.",
    "Thank you for calling, how can I help you today?",
    "The museum opens at ten and closes at six.",
)


def available_voices():
    """Voices whose model files are on disk: the bundled one, plus any already in Hibari's cache.
    Never downloads (no model hub is reachable from a server)."""
    from hibari.voices import VOICES, voice_path

    present = []
    for name in VOICES:
        try:
            voice_path(name, download_missing=False)
        except (FileNotFoundError, ValueError):
            continue
        present.append(name)
    return tuple(present)


def _session(model):
    """An onnxruntime session as Hibari builds one (one thread), with the CPU memory arena off. `model`:
    a path, or a serialised model, written to a temporary file first: onnxruntime's Python session keeps
    the bytes it is built from for its whole life (15.1 MiB a voice here, the model with its durations
    and its two halves), and nothing of a file (docs/decisions.md, "onnxruntime's sessions built from files").

    The arena keeps the largest buffers any call needed for the life of the process; without it freed
    buffers go back to malloc and speech.memory's trims return them to the OS. The memory pattern is off
    too: with it each call takes its intermediate tensors as one block of megabytes in the calling
    thread's heap, and where such blocks landed decided by chance how large that heap settled. Both
    measured no slower without (docs/decisions.md#memory-the-handshake-budget-and-memory-after-load)."""
    if isinstance(model, bytes):
        with tempfile.TemporaryDirectory(prefix="speech-model-") as folder:
            path = os.path.join(folder, "model.onnx")
            with open(path, "wb") as file:
                file.write(model)
            return _session(path)
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.log_severity_level = 3
    options.enable_cpu_mem_arena = False
    options.enable_mem_pattern = False
    return StoppableSession(ort.InferenceSession(model, options, providers=["CPUExecutionProvider"]))


def load_voice(name):
    """Hibari for one voice, its acoustic model (with its phoneme durations as an extra output,
    `model_with_durations`) and its G2P's out-of-vocabulary net on sessions without the arena. The OOV
    net is loaded now: Hibari would load it on the first word its lexicon lacks, i.e. inside some
    client's sentence, delaying its audio. The model cut in two (`hibari_pieces`) renders first parts in pieces."""
    from hibari import Hibari
    from hibari.g2p import G2P
    from hibari.g2p.oov import ASSETS, OOV
    from hibari.voices import VOICES

    british = VOICES[name]["british"]
    oov_path = os.path.join(ASSETS, "oov_gb.onnx" if british else "oov.onnx")
    tts = Hibari(voice=name, threads=1, g2p=G2P(oov=OOV(oov_path, session=_session(oov_path)), british=british))
    tts.sess = _session(model_with_durations(tts.model_path))
    tts.front, tts.back = (_session(model) for model in split_model(tts.model_path))
    tts.typical_gain = typical_gain(tts)
    return tts


def typical_gain(tts):
    """The loudness gain (`audio.loudness_gain`) of this voice's sentences, the median over a few: the
    gain of a part sent in pieces, chosen before most of it exists. A sentence's own gain varies
    little around it; its first piece's is biased (bench/RESULTS.md, "First words first")."""
    rate = tts.sample_rate
    gains = []
    for sentence in CALIBRATION:
        raw, _ = synthesise(tts.sess, tts.ids(tts.phonemize(sentence)[0]), 1.0, np.random.default_rng(0))
        gains.append(audio.loudness_gain(audio.trim_silence(raw, rate)))
    return float(np.median(gains))


class HibariEngine(Engine):
    def __init__(self, *, workers=1, meter=NO_METER):
        from hibari import SAMPLE_RATE
        from hibari.voices import DEFAULT

        voices = available_voices()
        noise_table()  # made now, not inside a client's first sentence
        self._models = {name: load_voice(name) for name in voices}
        self._pool = SynthesisPool(workers, "hibari", release_points=True, meter=meter)
        self.capabilities = Capabilities(
            name="hibari",
            voices=voices,
            default_voice=DEFAULT if DEFAULT in voices else voices[0],
            sample_rate=SAMPLE_RATE,
            # Hibari takes speed 0.5-2.0, but misses 1/speed and shifts the pitch; the pipeline's
            # time-stretch keeps both, so every speed goes through it
            # (docs/decisions.md#speed-is-done-here-not-by-the-engine).
            speed_range=(1.0, 1.0),
            aligns=True,  # word timings from the model's own durations, at next to no cost (hibari_align)
        )

    @classmethod
    def from_settings(cls, conf, meter=NO_METER):
        return cls(workers=conf.ENGINE_WORKERS, meter=meter)

    def _render(self, tts, plan, index, request, rng, offset):
        """Part `index` of the segment's plan: its audio as yielded, and with `request.timestamps` the
        timings of the words it reports (`offset`: the samples yielded before it)."""
        part = plan.parts[index]
        release_point()  # the model's run releases the GIL: the event loop takes the result this thread held back
        raw, steps = synthesise(tts.sess, part.ids, request.speed, rng)
        return self._finish(plan, part, request, raw, steps, offset)

    def _finish(self, plan, part, request, raw, steps, offset, *, first=None):
        """A part's raw audio trimmed, normalised and timed. `first`: what the part's first piece
        already sent (`_first_piece`): its samples, trim start, sound start, gain and the words timed."""
        rate = self.capabilities.sample_rate
        sound = audio.sound_bounds(raw, rate)
        kept = audio.trim_bounds(sound, raw.size, rate)
        if first is None:
            samples = audio.normalise(audio.trim_silence(raw, rate, kept))
            timing = alignment(plan, part, steps, kept, sound, offset, rate) if request.timestamps else None
        else:
            sent, start, sound_start, gain, early = first
            # Never shorter than the first piece, nor than the words it timed said (times never pass the end).
            said = start + int(np.ceil(early[-1].end_s * rate)) if early else 0
            kept = (start, min(raw.size, max(kept[1], sent, said)))
            sound = (sound_start, raw.size if sound is None else sound[1])
            samples = audio.normalise(audio.trim_silence(raw, rate, kept)[sent - start :], gain)
            timing = None
            if request.timestamps:
                words = alignment(plan, part, steps, kept, sound, offset, rate)
                timing = replace(words, words=_after(early, words.words[len(early) :]))
        return (audio.quantise(samples) if request.pcm16 else samples), timing

    def _first_piece(self, tts, plan, request, rng):
        """The segment's first part when the client waits with no audio (`request.first_words`): its
        first piece, trimmed as the part's audio and at the voice's typical gain (for the rest too; no
        louder than the piece's peak allows), with the words that start in it; and what `_rest` needs.
        A part too short to split, or with no sound in its first piece, is rendered whole (no rest)."""
        rate = self.capabilities.sample_rate
        part = plan.parts[0]
        release_point()
        pieces = Pieces(tts.front, tts.back, part.ids, request.speed, rng)
        if not pieces.split:
            return (*self._finish(plan, part, request, pieces.whole(), pieces.steps, 0), None)
        raw = pieces.first()
        sound = audio.sound_bounds(raw, rate)
        if sound is None:
            whole = np.concatenate((raw, pieces.rest()))
            return (*self._finish(plan, part, request, whole, pieces.steps, 0), None)
        start = audio.trim_bounds(sound, raw.size, rate)[0]
        head = audio.trim_silence(raw, rate, (start, raw.size))
        gain = min(tts.typical_gain, audio.PEAK_CEILING / float(np.max(np.abs(head))))
        samples = audio.normalise(head, gain)
        early: tuple[WordTiming, ...] = ()
        if request.timestamps:  # the words heard in this piece; the end of the sound is not known yet
            words = alignment(plan, part, pieces.steps, (start, pieces.samples), (sound[0], pieces.samples), 0, rate)
            early = tuple(itertools.takewhile(lambda w: w.start_s * rate < samples.size, words.words))
        timing = Alignment(early, estimated=part.estimated) if early else None
        rest = (pieces, raw, start, sound[0], gain, early)
        return (audio.quantise(samples) if request.pcm16 else samples), timing, rest

    def _rest(self, plan, request, rest):
        """The rest of the part `_first_piece` began: its audio after the first piece's, and the timings
        of the words it did not send."""
        pieces, head, start, sound_start, gain, early = rest
        release_point()
        raw = np.concatenate((head, pieces.rest()))
        first = (head.size, start, sound_start, gain, early)
        return self._finish(plan, plan.parts[0], request, raw, pieces.steps, 0, first=first)

    def _first(self, tts, request, seed):
        """Text normalising, G2P and the first sentence in one job: one thread hop before the first audio,
        and nothing of the client's text is worked on by the caller (`stream` is called on the event
        loop). The segment's random generator is made here too: without a seed numpy reads the OS's
        entropy (os.urandom), a system call that hands the GIL over, and the event loop then waited for a
        synthesis thread to give it back on its way to the first audio
        (docs/decisions.md#the-event-loop-kept-short). With `request.first_words`, the first sentence's first
        piece only."""
        rng = np.random.default_rng(seed)
        plan = hibari_words.plan(tts, request.text)
        if plan.parts and request.first_words:
            return (*self._first_piece(tts, plan, request, rng), plan, rng)
        if plan.parts:
            return (*self._render(tts, plan, 0, request, rng, 0), None, plan, rng)
        # Nothing to say: the words (if any) take no time.
        words = tuple(WordTiming(start, end, 0.0, 0.0) for start, end in plan.spans)
        return None, Alignment(words) if request.timestamps and words else None, None, plan, rng

    def stream(self, request: SynthesisRequest):
        """The segment's first job (its G2P and first sentence) is queued now, when called, not when the
        caller first iterates: a session's pipeline starts it in the step that queued the text, so it
        takes its place before other sessions' messages of the same loop turn are handled. Closing the
        stream before its first chunk drops that job if it has not started. With `request.timestamps`
        each sentence's `Alignment` comes right before its audio."""
        tts = self._models[request.voice]
        seed = request.options.get("seed")  # the handshake checked its range
        first = self._pool.submit(self._first, tts, request, seed, ticket=request.ticket)
        return _QueuedStream(self._pool, first, self._chunks(first, tts, request))

    async def _chunks(self, first, tts, request):
        chunk, timing, rest, plan, rng = await self._result(self._pool.wait(first))
        del first  # the job's result holds the first sentence's audio: not for the rest of the segment
        offset = 0
        for index in range(len(plan.parts)):
            if index:
                job = self._pool.run(self._render, tts, plan, index, request, rng, offset, ticket=request.ticket)
                chunk, timing = await self._result(job)
            if timing is not None and timing.words:
                yield timing
            if chunk.size:
                offset += chunk.size
                yield chunk
            if rest is not None:  # the first piece is on its way: now the rest of its part
                chunk, timing = await self._result(self._pool.run(self._rest, plan, request, rest, ticket=request.ticket))
                rest = None
                if timing is not None and timing.words:
                    yield timing
                if chunk.size:
                    offset += chunk.size
                    yield chunk
        if not plan.parts and timing is not None:
            yield timing

    async def _result(self, job):
        """One pool job's result; a failure inside Hibari on text the normaliser let through fails this
        segment with the contract's error and one log line: the text is the client's, the trace
        would only repeat Hibari's internals."""
        try:
            return await job
        except (EngineError, JobAbandoned):  # JobAbandoned: its listener left, nothing failed
            raise
        except Exception as exc:
            logger.warning("hibari failed on a segment: %s: %s", type(exc).__name__, exc)
            raise EngineError(FAILED_MESSAGE) from None

    def estimated_wait(self):
        return self._pool.estimated_wait()

    async def warm_up(self):
        for voice in self.capabilities.voices:
            async for _ in self.stream(SynthesisRequest(text="Warm up.", voice=voice)):
                pass

    async def aclose(self):
        self._pool.shutdown()


def _after(sent, words):
    """`words` no earlier than the last of the words `sent` ends (their end was timed before the part's
    sound was known)."""
    floor = sent[-1].end_s if sent else 0.0
    return tuple(replace(w, start_s=max(w.start_s, floor), end_s=max(w.end_s, floor)) for w in words)


class _QueuedStream:
    """A segment's chunks whose first pool job was queued when the stream was made: closing the stream
    before it is read drops that job if no thread has taken it yet; closing it closes the chunks."""

    def __init__(self, pool, first, chunks):
        self._pool, self._first, self._chunks = pool, first, chunks

    def __aiter__(self):
        return self

    def __anext__(self):
        # Read from here on: the reading task owns the job (cancelling it drops the job), and a
        # finished job's result (the first sentence's audio) must not live as long as this stream.
        self._first = None
        return self._chunks.__anext__()

    async def aclose(self):
        if self._first is not None:
            self._pool.discard(self._first)
            self._first = None
        await self._chunks.aclose()
