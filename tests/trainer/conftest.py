"""Trainer suite: real multi-process torchrun runs with gloo on CPU."""

import pytest


def pytest_collection_modifyitems(items):
    for item in items:
        if "/trainer/" in str(item.fspath) and "test_unit_" not in item.fspath.basename:
            item.add_marker(pytest.mark.slow)
