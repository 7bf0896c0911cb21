"""Audio after the engine: signal clean-up (signal.py), resampling and time-stretch (transforms.py),
the output formats and their media types (codecs.py), the session-wide mp3/opus/aac stream
(streaming.py), and the one encoder of a segment's samples for the session and the REST view (output.py)."""
