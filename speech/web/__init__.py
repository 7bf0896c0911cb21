"""Everything HTTP and WebSocket: the Channels consumer and its routing, the Origin policy,
authentication, the REST API, the ASGI guards and daphne with its socket backpressure."""
