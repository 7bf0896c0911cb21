"""Cross-instance control over Redis: cancel/terminate signals (signals.py), the channel layer
(layer.py), the session registry (registry.py) and per-key session slots (slots.py)."""
