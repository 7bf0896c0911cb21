"""An ASGI guard: a voice upload whose Content-Length is over the limit gets 413 at once.

Under ASGI, Django reads a request's whole body before a view runs, and daphne queues what
arrives; so the refusal happens here, from the header, before a byte of the body is received.
(A body sent without Content-Length is cut off by the view's upload handler instead.)
"""

import json

from .api import MULTIPART_SLACK, TOO_LARGE
from ..voices import MAX_UPLOAD_BYTES

UPLOAD_PATH = "/v1/audio/voices"


class UploadLimit:
    def __init__(self, app, limit=MAX_UPLOAD_BYTES + MULTIPART_SLACK):
        self.app = app
        self.limit = limit

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] == UPLOAD_PATH:
            length = dict(scope.get("headers", [])).get(b"content-length", b"")
            if length.isdigit() and int(length) > self.limit:
                body = json.dumps(TOO_LARGE).encode()
                await send(
                    {
                        "type": "http.response.start",
                        "status": 413,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close"),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)
