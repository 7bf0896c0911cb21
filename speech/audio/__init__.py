"""Audio after the engine: signal clean-up (signal.py), resampling and time-stretch (transforms.py),
and the output formats (codecs.py)."""
