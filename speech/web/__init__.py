"""Everything Django and Channels: the WebSocket consumer and its routing, the Origin policy,
authentication, the REST API, the ASGI guards, and the serving process's start and stop. daphne's
own extension (socket backpressure, the WebSocket protocol, the launcher) is speech/server/."""
