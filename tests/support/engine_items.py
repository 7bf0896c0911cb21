"""An engine's stream of one segment, read whole in process (tests of the real Hibari engine)."""

from __future__ import annotations

import asyncio

from speech.stream.engine import Alignment, SynthesisRequest


def speak(engine, text, **fields):
    """[(item, samples yielded before it)] of one segment."""

    async def run():
        items, before = [], 0
        request = SynthesisRequest(text=text, voice=engine.capabilities.default_voice, **fields)
        async for item in engine.stream(request):
            items.append((item, before))
            before += 0 if isinstance(item, Alignment) else item.size
        return items

    return asyncio.run(run())
