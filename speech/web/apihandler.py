"""Django for the machine-facing HTTP paths (`/v1/…`, `/healthz`, `/health`, `/metrics`), without the browser middleware.

Django's built-in middleware (security headers, sessions, CSRF, auth, messages, clickjacking) are
sync-only: under ASGI each costs two thread hops per request. The REST API needs none of them (API
keys, no cookies, CSRF-exempt views), so its paths go to a handler with no middleware at all, which
shortens every request, the upstream hop and REST time to first audio with them
(docs/decisions.md#the-event-loop-kept-short). Everything else (the admin, its static files) keeps the full stack.
"""

from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.exception import convert_exception_to_response

from .. import metrics

API_PREFIXES = ("/v1/", "/health", "/metrics")


class APIHandler(ASGIHandler):
    def load_middleware(self, is_async=False):
        """What Django's own load_middleware builds for an empty MIDDLEWARE."""
        self._view_middleware = []
        self._template_response_middleware = []
        self._exception_middleware = []
        self._middleware_chain = convert_exception_to_response(self._get_response_async if is_async else self._get_response)

    async def get_response_async(self, request):
        response = await super().get_response_async(request)
        metrics.rest_request(request, response)  # every API request, by route name and status
        return response


class PathRouter:
    """HTTP by path: the API's paths to `api`, the rest to `site`."""

    def __init__(self, api, site):
        self.api, self.site = api, site

    async def __call__(self, scope, receive, send):
        app = self.api if scope["path"].startswith(API_PREFIXES) else self.site
        await app(scope, receive, send)
