"""Helpers shared by the test suites (not fixtures: those live in conftest.py)."""
