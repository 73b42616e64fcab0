"""The fault suite's fixtures; the helpers live in faultkit.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from faultkit import kill_groups, new_marker, with_marker


@pytest.fixture
def marker() -> Iterator[str]:
    """A word unique to this test, put into the DAG's commands; whatever still runs with
    it when the test ends is killed (tests that care check for survivors themselves)."""
    word = new_marker()
    yield word
    left = with_marker(word)
    if left:
        kill_groups(left)
