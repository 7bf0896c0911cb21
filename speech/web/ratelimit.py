"""Per-key REST request rate: SPEECH_KEY_REQUESTS_PER_MINUTE, a token bucket per key in each process.

A key may spend a minute's worth of requests at once, then one more each 60/rate seconds; past that
the request is refused with 429 and `Retry-After` (whole seconds until the next one is allowed).
Counted per instance, never shared: N instances let a key through N times the rate (docs/security.md).
Only live keys reach here, so the buckets are as many as the keys in use.
"""

from __future__ import annotations

import math
import threading
import time


class Buckets:
    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self._lock = threading.Lock()  # the sync REST views run on Django's worker threads
        self._buckets: dict[str, tuple[float, float]] = {}  # key prefix -> (tokens, when)

    def take(self, key, per_minute):
        """0 when the key may make this request (one token taken), else the whole seconds to wait."""
        if per_minute <= 0:
            return 0
        now = self.clock()
        with self._lock:
            tokens, then = self._buckets.get(key, (float(per_minute), now))
            tokens = min(float(per_minute), tokens + (now - then) * per_minute / 60.0)
            if tokens >= 1.0:
                self._buckets[key] = (tokens - 1.0, now)
                return 0
            self._buckets[key] = (tokens, now)
            return max(1, math.ceil((1.0 - tokens) * 60.0 / per_minute))


buckets = Buckets()
