"""A real Pipecat pipeline around SpeechServerTTSService, for the tests and bench/pipecat_agent.py,
shaped as a bot's output side is:

    tts -> PacedOutputTransport -> assistant context aggregator

PacedOutputTransport is Pipecat's BaseOutputTransport with a write that takes as long as the audio
lasts, as a real-time transport (WebRTC, telephony) does, so that frames after it are "played". An
observer (no processor of its own, so no extra hop) keeps the frames on each link with the pipeline
clock's time they were pushed: `text` into the service, `into` from it to the transport, `played`
from the transport on (word frames come out of its clock queue at their presentation time). Every
time here is the pipeline clock's, in seconds (`Bot.now()`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from pipecat.frames.frames import (
    EndFrame,
    Frame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    OutputAudioRawFrame,
    StartFrame,
    TTSAudioRawFrame,
    TTSStoppedFrame,
    TTSTextFrame,
)
from pipecat.observers.base_observer import BaseObserver, FramePushed
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.transports.base_output import BaseOutputTransport
from pipecat.transports.base_transport import TransportParams
from pipecat.workers.runner import WorkerRunner
from pipecat_speechserver import SpeechServerTTSService

WAIT_S = 60.0  # hang guard: every wait ends on an event the pipeline produces on its own


class PacedOutputTransport(BaseOutputTransport):
    """An output transport that plays audio in real time (and discards it), as a sound device does:
    at its sample rate from the moment it started, late wake-ups not adding up. `runs` are the
    times playing started after silence; `interrupted_at` when interruptions reached it."""

    def __init__(self, params: TransportParams) -> None:
        super().__init__(params)
        self.play_until = 0.0
        self.runs: list[float] = []
        self.interrupted_at: list[float] = []

    async def start(self, frame: StartFrame) -> None:
        await super().start(frame)
        await self.set_transport_ready(frame)

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        if isinstance(frame, InterruptionFrame):
            self.interrupted_at.append(self.get_clock().get_time() / 1e9)
        await super().process_frame(frame, direction)

    async def write_audio_frame(self, frame: OutputAudioRawFrame) -> bool:
        now = self.get_clock().get_time() / 1e9
        if now >= self.play_until:
            self.play_until = now
            self.runs.append(now)
        self.play_until += len(frame.audio) / (2 * frame.sample_rate * frame.num_channels)
        await asyncio.sleep(self.play_until - now)
        return True


@dataclass
class Seen:
    at: float  # pipeline clock, seconds
    frame: Frame


class Link:
    """The frames pushed downstream over one link of the pipeline, in order."""

    def __init__(self) -> None:
        self.seen: list[Seen] = []
        self.changed = asyncio.Event()

    def add(self, seen: Seen) -> None:
        self.seen.append(seen)
        self.changed.set()

    async def wait_for(self, predicate: Callable[[list[Seen]], object], timeout: float = WAIT_S) -> object:
        """The first truthy predicate(seen), waiting for more frames until then."""
        async with asyncio.timeout(timeout):
            while not (found := predicate(self.seen)):
                self.changed.clear()
                await self.changed.wait()
        return found

    def of(self, kind: type[Frame], context_id: str | None = None) -> list[Seen]:
        return [s for s in self.seen if isinstance(s.frame, kind) and (context_id is None or s.frame.context_id == context_id)]


class Links(BaseObserver):
    """Files each downstream push under the link it crossed: into the service, into the transport, out of it."""

    def __init__(self, tts: FrameProcessor, transport: FrameProcessor) -> None:
        super().__init__()
        self.tts, self.transport = tts, transport
        self.text, self.into, self.played = Link(), Link(), Link()

    async def on_push_frame(self, data: FramePushed) -> None:
        if data.direction != FrameDirection.DOWNSTREAM:
            return
        seen = Seen(data.timestamp / 1e9, data.frame)
        if data.destination is self.tts:
            self.text.add(seen)
        elif data.source is self.tts and data.destination is self.transport:
            self.into.add(seen)
        elif data.source is self.transport:
            self.played.add(seen)


class RecordingService(SpeechServerTTSService):
    """The service, keeping what the server sent for each context (its segments' words and audio
    bytes) and when: its first text went out (`sent_at`) and its first audio came in (`heard_at`)."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.segments: dict[str | None, list[dict]] = {}
        self._segment: dict | None = None
        self.sent_at: dict[str, float] = {}
        self.heard_at: dict[str, float] = {}

    async def _send(self, message: dict) -> None:
        if message["type"] == "input.text":
            self.sent_at.setdefault(message["context_id"], self.get_clock().get_time() / 1e9)
        await super()._send(message)

    async def _event(self, event: dict) -> None:
        if event["type"] == "audio.start":
            self._segment = {"words": [], "audio_bytes": 0}
            self.segments.setdefault(event.get("context_id"), []).append(self._segment)
        elif event["type"] == "audio.timestamps" and self._segment is not None:
            self._segment["words"] += event["words"]
        await super()._event(event)

    async def _audio(self, data: bytes) -> None:
        if self._segment is not None:
            self._segment["audio_bytes"] += len(data)
        if self._current is not None:
            self.heard_at.setdefault(self._current, self.get_clock().get_time() / 1e9)
        await super()._audio(data)


class Bot:
    """The pipeline, running; `say()` sends one LLM turn as tokens."""

    def __init__(self, url: str, *, sample_rate: int = 24000, **service_args: object) -> None:
        self.tts = RecordingService(url=url, sample_rate=sample_rate, **service_args)
        self.transport = PacedOutputTransport(TransportParams(audio_out_enabled=True, audio_out_sample_rate=sample_rate))
        self.links = Links(self.tts, self.transport)
        self.text, self.into, self.played = self.links.text, self.links.into, self.links.played
        self.context = LLMContext()
        self.aggregators = LLMContextAggregatorPair(self.context)
        assistant = self.aggregators.assistant()
        self.worker = PipelineWorker(
            Pipeline([self.tts, self.transport, assistant]),
            params=PipelineParams(audio_out_sample_rate=sample_rate),
            observers=[self.links],
            cancel_on_idle_timeout=False,
        )
        self.runner = WorkerRunner(handle_sigint=False)
        self.connected = 0
        self.cancelled: dict[str, dict] = {}
        self.cancelled_event = asyncio.Event()

        self.turns: list = []  # the aggregator's AssistantTurnStoppedMessage of each turn
        self.turn_stopped = asyncio.Event()

        @assistant.event_handler("on_assistant_turn_stopped")
        async def on_turn_stopped(_aggregator, message):
            self.turns.append(message)
            self.turn_stopped.set()

        @self.tts.event_handler("on_connected")
        async def on_connected(_service):
            self.connected += 1

        @self.tts.event_handler("on_context_cancelled")
        async def on_context_cancelled(_service, event):
            self.cancelled[event["context_id"]] = event
            self.cancelled_event.set()

    async def __aenter__(self) -> Bot:
        started = asyncio.Event()

        @self.worker.event_handler("on_pipeline_started")
        async def on_started(_worker, _frame):
            started.set()

        await self.runner.add_workers(self.worker)
        self.task = asyncio.create_task(self.runner.run())
        async with asyncio.timeout(WAIT_S):
            await started.wait()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.worker.queue_frame(EndFrame())
        async with asyncio.timeout(WAIT_S):
            await self.task

    def now(self) -> float:
        """The pipeline clock, in seconds: every time the harness records is on it."""
        return self.transport.get_clock().get_time() / 1e9

    async def say(self, tokens: list[str]) -> None:
        await self.worker.queue_frames(
            [LLMFullResponseStartFrame(), *(LLMTextFrame(token) for token in tokens), LLMFullResponseEndFrame()]
        )

    async def interrupt(self) -> None:
        await self.worker.queue_frame(InterruptionFrame())

    async def wait_cancelled(self, context_id: str) -> dict:
        async with asyncio.timeout(WAIT_S):
            while context_id not in self.cancelled:
                self.cancelled_event.clear()
                await self.cancelled_event.wait()
        return self.cancelled[context_id]

    async def wait_turns(self, count: int) -> list:
        """The aggregator's first `count` turns (content, interrupted), once it has written them."""
        async with asyncio.timeout(WAIT_S):
            while len(self.turns) < count:
                self.turn_stopped.clear()
                await self.turn_stopped.wait()
        return self.turns[:count]

    def words(self, context_id: str) -> list[TTSTextFrame]:
        return [s.frame for s in self.played.of(TTSTextFrame, context_id)]

    def turn_done(self, context_id: str) -> Callable[[list[Seen]], bool]:
        return lambda seen: any(isinstance(s.frame, TTSStoppedFrame) and s.frame.context_id == context_id for s in seen)

    def first_audio_context(self, after: float = 0.0) -> Callable[[list[Seen]], str | None]:
        return lambda seen: next(
            (s.frame.context_id for s in seen if s.at >= after and isinstance(s.frame, TTSAudioRawFrame)), None
        )

    def assistant_messages(self) -> list[str]:
        return [m["content"] for m in self.context.get_messages() if m.get("role") == "assistant"]
