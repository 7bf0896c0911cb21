"""ASGI entry point: `daphne ttsproject.asgi:application` from the project root.

HTTP goes to Django (the API's paths without the browser middleware, speech/web/apihandler.py);
WebSocket goes through the Origin policy to the speech consumer. The engine
is built and warmed up here, before daphne listens, so the first client pays nothing.
"""

import asyncio
import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ttsproject.settings")

from django.core.asgi import get_asgi_application  # noqa: E402

django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from speech.web.apihandler import APIHandler, PathRouter  # noqa: E402
from speech.web.bodylimit import UploadLimit  # noqa: E402
from speech.conf import conf  # noqa: E402
from speech.runtime import get_engine  # noqa: E402
from speech.web.origin import origin_policy  # noqa: E402
from speech.web.routing import websocket_urlpatterns  # noqa: E402

if conf.WARM_UP:
    asyncio.run(get_engine().warm_up())

application = ProtocolTypeRouter(
    {
        "http": UploadLimit(PathRouter(api=APIHandler(), site=django_asgi_app)),
        "websocket": origin_policy(URLRouter(websocket_urlpatterns)),
    }
)
