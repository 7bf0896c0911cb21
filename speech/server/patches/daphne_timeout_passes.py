"""daphne's check of its connections' timeouts and keepalive pings, spread over its period in passes.

Upstream: daphne's `Server.timeout_checker` (daphne 4.2, server.py) checks every connection every 2 s
in one loop turn, sending the pings that are due. Sessions opened together (a burst of clients, a
reconnect after a restart) fall due together and stay so, each ping restarting its interval in the same
turn: with 2,000 idle sessions that turn, and the pongs that answer it, held the handshakes under way
longer than anything else (bench/RESULTS.md, "Handshakes beside idle sessions"; docs/decisions.md).
No upstream issue is filed.

A pass is a timer of Twisted's on the loop, which costs its wake-ups whether or not it finds anything:
40 passes every 2 s took 2.6 ms of the idle loop's CPU a second (docs/decisions.md, "The event loop's
CPU per audio second"), so a period has only as many passes as its connections need.
"""

from twisted.internet import reactor

TIMEOUT_CHECK_S = 2.0  # daphne's period
PASS_CONNECTIONS = 50  # connections a pass checks, unless there are more than TIMEOUT_PASSES times as many
TIMEOUT_PASSES = 40  # passes a period at most


def passes_for(connections: int) -> int:
    """Passes in a period that begins with this many connections: one per PASS_CONNECTIONS, at least one."""
    return min(TIMEOUT_PASSES, max(1, -(-connections // PASS_CONNECTIONS)))


class TimeoutPasses:
    """For a subclass of daphne's Server: each TIMEOUT_CHECK_S a period of `passes_for` passes, fixed when
    the period begins, each over every n-th connection by its position in `connections` (where the
    sessions opened together stand together). Each connection is still checked once a period, and a
    loop turn sends at most about PASS_CONNECTIONS (or 1/TIMEOUT_PASSES) of the pings that fall due
    together; with few connections a period is daphne's one pass."""

    _timeout_pass = 0  # which pass of the period runs next
    _timeout_passes = 1  # passes in the current period

    def timeout_checker(self):
        if self._timeout_pass == 0:
            self._timeout_passes = passes_for(len(self.connections))
        passes = self._timeout_passes
        for protocol in list(self.connections)[self._timeout_pass :: passes]:
            protocol.check_timeouts()
        self._timeout_pass = (self._timeout_pass + 1) % passes
        reactor.callLater(TIMEOUT_CHECK_S / passes, self.timeout_checker)


def applied():
    from ..launcher import SpeechServer

    return SpeechServer.timeout_checker is TimeoutPasses.timeout_checker
