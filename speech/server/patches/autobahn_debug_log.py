"""autobahn builds the arguments of its debug log lines before it calls `log.debug`.

Upstream: autobahn (26.11) formats them eagerly in `autobahn/websocket/protocol.py` and
`autobahn/twisted/websocket.py` (`pformat` of its 29 settings for every new connection, names
coloured with click for every read), although txaio has made `log.debug` a no-op at any level above
debug; no upstream issue is filed. That was an eighth of the event loop's work for a session's
handshake (cProfile of `manage.py serve`, 500 sessions). `apply()` wraps those formatters in `LogArgument`, so the work happens
only if a log observer renders the line, and the text is the same.
"""

import functools
import pprint

from autobahn.twisted import websocket as autobahn_twisted
from autobahn.websocket import protocol as autobahn_protocol

# Every use of these names in the two modules daphne runs is an argument of a debug log line,
# except `Timings.__str__`'s pformat, which is given back its eager one.
DEFERRED = ((autobahn_protocol, ("pformat", "hltype", "hlval")), (autobahn_twisted, ("hltype", "hlval")))


class LogArgument:
    """An argument of one of autobahn's debug log lines, formatted only when the line is rendered."""

    __slots__ = ("_formatter", "_args")

    def __init__(self, formatter, *args):
        self._formatter = formatter
        self._args = args

    def __str__(self):
        return str(self._formatter(*self._args))

    __repr__ = __str__


def _timings_str(timings):
    return pprint.pformat(timings._timings)


def _deferred(function):
    return isinstance(function, functools.partial) and function.func is LogArgument


def apply():
    """Defer the formatting of autobahn's debug log arguments (once per process)."""
    if applied():
        return
    for module, names in DEFERRED:
        for name in names:
            setattr(module, name, functools.partial(LogArgument, getattr(module, name)))
    autobahn_protocol.Timings.__str__ = _timings_str


def applied():
    return all(_deferred(getattr(module, name)) for module, names in DEFERRED for name in names) and (
        autobahn_protocol.Timings.__str__ is _timings_str
    )
