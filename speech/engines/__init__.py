"""The engines: implementations of the engine port (speech/stream/engine.py). The process's engine is
chosen by name and built in speech/runtime.py."""
