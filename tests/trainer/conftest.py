"""Trainer suite: real multi-process torchrun runs with gloo on CPU.

Each module declares its markers (``pytestmark = pytest.mark.slow``; the ``test_unit_*``
modules are fast and carry none): tests/conftest.py orders the session by marker and
never adds one.
"""
