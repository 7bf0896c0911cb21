"""Changes to third-party classes (autobahn, daphne, Twisted under uvloop), one module each.

Each module names the upstream behaviour it works around and has `applied()`, which says whether the
server runs with it (tests/test_server_patches.py checks every module here).
"""
