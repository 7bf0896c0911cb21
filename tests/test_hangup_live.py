"""A hang-up frees the engine at once, over real sockets: a real daphne (`manage.py serve`), Hibari.

Clients that speak a long text drop their TCP connections mid-stream. Read from the server's own
record in /metrics (speech/engines/pool.py's counts and queue gauge): by the time the server has ended
their sessions, no job of theirs waits for a thread or holds one, their queued jobs were dropped
unrun, and a newcomer is served. Waits are bounded polls of states the server reaches on its own.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.support.live import (
    configure,
    metric,
    module_server,
    open_session,
    recv_item,
    run_session,
    send_json,
    wait_for,
)

pytestmark = pytest.mark.live

CONFIG = {"response_format": "pcm", "stream_audio": True}
LONG_TEXT = " ".join(f"This is sentence number {i} of an answer nobody will hear to the end." for i in range(12)) + " "
OUTCOMES = ("completed", "failed", "dropped", "stopped", "unheard")
CALLERS = 6  # more sessions than synthesis threads: jobs wait for a thread when the clients leave


server = module_server()


def record(server):
    return {outcome: metric(server, "speech_engine_jobs_total", outcome=outcome) for outcome in OUTCOMES}


async def speaking(url):
    """A session mid-stream: its long text sent, its first audio frame read."""
    ws = await open_session(url)
    await configure(ws, CONFIG)
    await send_json(ws, {"type": "input.text", "text": LONG_TEXT})
    while (await recv_item(ws)).kind != "audio":
        pass
    return ws


async def test_after_a_hang_up_no_job_of_that_session_waits_for_or_holds_a_thread(server):
    before = record(server)
    callers = await asyncio.gather(*(speaking(server.ws_url) for _ in range(CALLERS)))
    for ws in callers:
        ws.transport.abort()  # gone without a close frame
    # Off this loop: it still has to close the sockets.
    await asyncio.to_thread(wait_for, lambda: metric(server, "speech_sessions_active") == 0, "the server ended the sessions")
    # Read once the sessions have ended: their jobs neither wait nor hold a place, whether or not a step
    # that was running when they left is still finishing on a thread of its own.
    assert metric(server, "speech_engine_queue_depth") == 0
    after = record(server)
    assert after["dropped"] > before["dropped"]  # jobs they had queued never ran
    assert after["failed"] == before["failed"]
    log = server.stderr_text()
    assert "failed on a segment" not in log and "synthesis failed" not in log  # a hang-up is no engine failure

    result = await run_session(server.ws_url, CONFIG, ["A newcomer is served at once."])
    assert result.close_code == 1000 and result.audio_frames
    server.assert_no_traceback()
