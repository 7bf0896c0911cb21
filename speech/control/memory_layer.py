"""The channel layer without REDIS_URL (one instance): Channels' `InMemoryChannelLayer`, with its clean-up of
expired messages and group memberships run at most once every CLEAN_EVERY_S.

The stock layer runs that clean-up, a walk over every channel and every group of the process, on every
`receive` and `group_send`: each session's consumer calls `receive` when it starts, so every handshake
walked every open session's entries first, and handshakes arriving together waited for each other's
walks (bench/RESULTS.md, "Handshakes beside idle sessions"; docs/decisions.md, "The in-memory channel
layer cleans up once a second"). What the walk removes (a message unread for the layer's `expiry`, 60 s; a membership
older than `group_expiry`, a day) can wait a second longer.
"""

from __future__ import annotations

import time

from channels.layers import InMemoryChannelLayer

CLEAN_EVERY_S = 1.0


class SpeechInMemoryChannelLayer(InMemoryChannelLayer):
    _cleaned_at = float("-inf")  # monotonic time of the last clean-up

    def _clean_expired(self):
        now = time.monotonic()
        if now - self._cleaned_at < CLEAN_EVERY_S:
            return
        self._cleaned_at = now
        super()._clean_expired()
