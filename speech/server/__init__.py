"""The daphne/Twisted extension: the WebSocket protocol, the per-connection transport with its flow
control, TCP-window reads, the event loop, the memory budget for large frames, the launcher, and
the patches of third-party classes (speech/server/patches/). The only package that imports daphne,
Twisted, autobahn or zope; it imports nothing of speech/web/ or speech/control/ (web uses it, and
hands the launcher the project's start and stop)."""
