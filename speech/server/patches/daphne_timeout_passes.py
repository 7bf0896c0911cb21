"""daphne's check of its connections' timeouts and keepalive pings, spread over its period in passes.

Upstream: daphne's `Server.timeout_checker` (daphne 4.2, server.py) checks every connection every 2 s
in one loop turn, sending the pings that are due. Sessions opened together (a burst of clients, a
reconnect after a restart) fall due together and stay so, each ping restarting its interval in the same
turn: with 2,000 idle sessions that turn, and the pongs that answer it, held the handshakes under way
longer than anything else (bench/RESULTS.md, "Handshakes beside idle sessions"; docs/decisions.md).
No upstream issue is filed.
"""

from twisted.internet import reactor

TIMEOUT_CHECK_S = 2.0  # daphne's period
TIMEOUT_PASSES = 40


class TimeoutPasses:
    """For a subclass of daphne's Server: TIMEOUT_PASSES passes per TIMEOUT_CHECK_S, each over every
    TIMEOUT_PASSES-th connection by its position in `connections` (where the sessions opened together
    stand together). Each connection is still checked once a period, and a loop turn sends at most
    1/TIMEOUT_PASSES of the pings that fall due together."""

    _timeout_pass = 0  # which pass runs next

    def timeout_checker(self):
        for protocol in list(self.connections)[self._timeout_pass :: TIMEOUT_PASSES]:
            protocol.check_timeouts()
        self._timeout_pass = (self._timeout_pass + 1) % TIMEOUT_PASSES
        reactor.callLater(TIMEOUT_CHECK_S / TIMEOUT_PASSES, self.timeout_checker)


def applied():
    from ..launcher import SpeechServer

    return SpeechServer.timeout_checker is TimeoutPasses.timeout_checker
