"""The session core, plain asyncio: the wire protocol, the session, segmentation, the synthesis
pipeline and the protocol's errors. It imports neither Django nor Channels (tests/test_layout.py):
the web side hands it a transport, an engine and its Limits."""
