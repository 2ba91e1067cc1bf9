"""tests/core runs with --import-mode=importlib (pyproject.toml), which does not put this folder on
sys.path; the shared helpers _oracle.py and _buffers.py are imported from here."""

import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
if _here not in sys.path:
    sys.path.insert(0, _here)


import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _release_descriptor_buffers():
    yield
    import _buffers

    _buffers.ALIVE.clear()
