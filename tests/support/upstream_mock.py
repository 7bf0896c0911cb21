"""The upstream speech server as an `httpx.MockTransport`: for the tests of OpenAIEngine that check
request bodies and how statuses and response headers map to errors. No socket is involved, so a Reply
that needs one (hold, hang, drop, raw bytes, a broken or trickling stream) is refused here: those faults
stay with the loopback stand-in (tests/support/upstream_standin.py), which speaks real HTTP/1.1.

    mock = MockUpstream()
    mock.script(error_reply(429, "Slow down."))
    engine = OpenAIEngine(url=mock.url, transport=mock.transport)
"""

from __future__ import annotations

import collections

import httpx

from .upstream_standin import Reply, Request, voices_reply

SOCKET_FAULTS = ("hold", "hang", "drop", "raw", "break_after", "interval_s")


class MockUpstream:
    """Same script / requests / voices as StandIn: POSTs take the scripted replies in order, then `default`;
    GET /v1/audio/voices answers `voices` (a JSON payload, a Reply, or None for a 404)."""

    url = "http://upstream.test/v1"

    def __init__(self, voices=None, default=None):
        self.voices = voices
        self.default = default or Reply()
        self.requests: list[Request] = []
        self._script: collections.deque[Reply] = collections.deque()
        self.transport = httpx.MockTransport(self._handle)

    def script(self, *replies):
        for reply in replies:
            faults = [name for name in SOCKET_FAULTS if getattr(reply, name)]
            assert not faults, f"{faults} need a socket: use StandIn"
        self._script.extend(replies)

    def _handle(self, request: httpx.Request) -> httpx.Response:
        recorded = Request(request.method, request.url.raw_path.decode(), dict(request.headers), request.content)
        self.requests.append(recorded)
        if request.method == "GET":
            reply = voices_reply(self.voices)
        else:
            reply = self._script.popleft() if self._script else self.default
        body = reply.body if reply.body is not None else b"".join(reply.chunks)
        return httpx.Response(reply.status, headers=reply.headers, content=body)
