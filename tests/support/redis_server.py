"""A private `redis-server` for the tests and benchmarks that stop and start Redis: a free local port,
no persistence, its own folder. The machine's own Redis (127.0.0.1:6379) is never touched.

Used by tests/test_redis_faults.py, test_control.py, test_control_live.py, test_observability.py,
test_deploy.py, bench/handshake.py and bench/cancel.py.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from .live import free_port

REDIS_START_S = 20.0  # hang guards


class RedisServer:
    """`redis-server` on a free local port, in the foreground of a subprocess: start, kill, restart."""

    def __init__(self, port=None):
        self.port = port or free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="redis-test-"))
        self.proc = None

    def url(self, db=0):
        return f"redis://127.0.0.1:{self.port}/{db}"

    def client(self):
        return redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=1, socket_timeout=5)

    def start(self):
        assert self.proc is None or self.proc.poll() is not None, "already running"
        log = open(self.dir / "redis.log", "ab")
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.dir),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        log.close()
        deadline = time.monotonic() + REDIS_START_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}: {self.log()[-2000:]}")
            try:
                with self.client() as client:
                    if client.ping():
                        return self
            except redis.RedisError:
                time.sleep(0.02)
        self.kill()
        raise RuntimeError(f"redis-server did not answer on port {self.port}: {self.log()[-2000:]}")

    def kill(self):
        """SIGKILL: the abrupt end of Redis (connections reset, nothing flushed)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def group_members(self, session_id, db=0, prefix="speech"):
        """Channels in the session's channel-layer group (its consumer joins it; speech/control/layer.py)."""
        with redis.Redis(host="127.0.0.1", port=self.port, db=db, socket_connect_timeout=1) as client:
            return client.zcard(f"{prefix}:group:speech.session.{session_id}")

    def has_key(self, key, db=0):
        with redis.Redis(host="127.0.0.1", port=self.port, db=db, socket_connect_timeout=1) as client:
            return bool(client.exists(key))

    def log(self):
        path = self.dir / "redis.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def cleanup(self):
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc_info):
        self.cleanup()
        return False
