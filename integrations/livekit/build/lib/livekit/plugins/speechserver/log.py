import logging

logger = logging.getLogger("livekit.plugins.speechserver")
