"""Helpers and fixtures the test modules share (tests/conftest.py makes the fixtures available)."""
