"""Helpers of the live tests that drive sessions on real servers and call their REST control endpoints
(tests/test_control_live.py, tests/test_redis_faults.py), and the after-test health check of every
live module."""

from __future__ import annotations

import asyncio
import http.client
import http.cookiejar
import json
import re
import urllib.parse
import urllib.request

from .live import audio_past, collect, configure, held, metric, open_session, send_json, wait_for

CONFIG = {"response_format": "pcm", "stream_audio": True}


def request(server, method, path, body=None, headers=None):
    """One HTTP request: (status, parsed JSON body or text)."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        raw = response.read()
        try:
            return response.status, json.loads(raw)
        except ValueError:
            return response.status, raw.decode(errors="replace")
    finally:
        conn.close()


async def rest(server, method, path, **kwargs):
    """request() off the event loop, so the test's own sockets keep being served meanwhile."""
    return await asyncio.to_thread(request, server, method, path, **kwargs)


def server_cancels(server):
    """Server cancels (REST, admin, group_send) that `server`'s sessions have acted on."""
    return metric(server, "speech_cancels_total", origin="server")


async def acted_on_cancel(holder, since):
    """Wait (bounded) until `holder`, the instance that holds the session, has acted on a server cancel
    counted after `since` (a server_cancels() value). A 202 means accepted and on its way through Redis;
    a client that read on at once could find the speech moved past the held segment before the signal
    arrived (after a failover the holder's receive loop may take seconds to notice its dead connection)."""
    await asyncio.to_thread(wait_for, lambda: server_cancels(holder) > since, "the holder acted on the cancel")


def cancel_path(session_id):
    return f"/v1/audio/speech/sessions/{session_id}/cancel"


def session_path(session_id):
    return f"/v1/audio/speech/sessions/{session_id}"


async def speak_and_stop_reading(ws, server):
    """Some audio of the speech under way, then the client stops reading until the server holds the
    session mid-segment (backpressure), so that a signal finds a segment half sent."""
    before = await collect(ws, until=audio_past(1.0))
    assert before.close_code is None, f"closed while speaking: {before.types()}"
    await asyncio.to_thread(held, server)
    return before


async def speaking_session(server, text, config=CONFIG):
    """A session on `server` speaking `text` (long), held mid-segment. Returns (ws, session id, items so far)."""
    ws = await open_session(server.ws_url, small_buffers=True)
    configured = await configure(ws, config)
    await send_json(ws, {"type": "input.text", "text": text})
    before = await speak_and_stop_reading(ws, server)
    return ws, configured["session_id"], before.items


class Admin:
    """A session-authenticated browser-like client (cookies, CSRF token) for Django's admin."""

    def __init__(self, server):
        self.base = server.http_url
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))

    def get(self, path):
        with self.opener.open(self.base + path, timeout=30) as response:
            return response.read().decode()

    def post(self, path, fields):
        data = urllib.parse.urlencode(fields, doseq=True).encode()
        with self.opener.open(self.base + path, data, timeout=30) as response:
            return response.read().decode()

    @staticmethod
    def token(page):
        match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
        assert match, "no CSRF token on the page"
        return match.group(1)

    def login(self, username, password):
        page = self.get("/admin/login/?next=/admin/")
        page = self.post(
            "/admin/login/?next=/admin/",
            {"username": username, "password": password, "csrfmiddlewaretoken": self.token(page), "next": "/admin/"},
        )
        assert "Log out" in page or "logout" in page, "admin login failed"

    def action(self, path, action, selected):
        page = self.get(path)
        return self.post(
            path,
            {
                "csrfmiddlewaretoken": self.token(page),
                "action": action,
                "index": "0",
                "select_across": "0",
                "_selected_action": selected,
            },
        )
