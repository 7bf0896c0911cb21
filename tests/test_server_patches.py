"""Every patch of a third-party class (speech/server/patches/) is in force in the server that
`manage.py serve` runs, and each says which upstream behaviour it works around."""

from __future__ import annotations

import importlib
import pkgutil
import pprint

from autobahn.websocket import protocol as autobahn_protocol
from daphne.server import Server
from daphne.ws_protocol import WebSocketProtocol

from speech.server import patches
from speech.server.launcher import SpeechServer  # what manage.py serve runs: it imports every patch
from speech.server.patches import (
    autobahn_debug_log,
    daphne_backpressure,
    daphne_shutdown,
    daphne_timeout_passes,
    uvloop_closed_handle,
)
from speech.server.websocket import SpeechWebSocket


def patch_modules():
    return [importlib.import_module(f"{patches.__name__}.{info.name}") for info in pkgutil.iter_modules(patches.__path__)]


def test_every_patch_module_is_applied_and_names_what_it_works_around():
    modules = patch_modules()
    assert {module.__name__ for module in modules} >= {
        autobahn_debug_log.__name__,
        daphne_backpressure.__name__,
        daphne_shutdown.__name__,
        daphne_timeout_passes.__name__,
        uvloop_closed_handle.__name__,
    }
    assert [module.__name__ for module in modules if not module.applied()] == []
    assert [module.__name__ for module in modules if "Upstream:" not in (module.__doc__ or "")] == []


UNDONE = (  # each patch, and the upstream attribute that undoes it
    (autobahn_debug_log, autobahn_protocol, "pformat", pprint.pformat),
    (daphne_backpressure, SpeechServer, "create_application", Server.create_application),
    (daphne_shutdown, SpeechServer, "kill_all_applications", Server.kill_all_applications),
    (daphne_timeout_passes, SpeechServer, "timeout_checker", Server.timeout_checker),
    (uvloop_closed_handle, SpeechWebSocket, "sendData", WebSocketProtocol.sendData),
)


def test_each_check_sees_its_patch_undone(monkeypatch):
    for module, owner, name, upstream in UNDONE:
        with monkeypatch.context() as undone:
            undone.setattr(owner, name, upstream)
            assert not module.applied(), module.__name__
    assert all(module.applied() for module, *_ in UNDONE)


def test_applying_twice_wraps_autobahns_formatters_once():
    autobahn_debug_log.apply()
    formatter = autobahn_protocol.pformat
    assert formatter.func is autobahn_debug_log.LogArgument and formatter.args[0] is pprint.pformat
