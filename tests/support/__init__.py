"""Helpers shared by the test modules (servers, recorders, decoders, samples); no tests here."""
