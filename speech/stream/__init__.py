"""The session core, plain asyncio: the wire protocol, the session, segmentation, the synthesis
pipeline and the protocol's errors, with the ports it talks to the world through: `Transport`
(session.py), the engine (engine.py), the `Meter` (meter.py). It imports nothing of the adapters,
Django, Channels, daphne, Twisted or Prometheus (tests/test_layout.py): the server hands it a
transport, an engine, a meter and its Limits, and reads its end from its SessionSummary."""
