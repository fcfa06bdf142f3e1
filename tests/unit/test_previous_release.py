"""The previous release the upgrade test builds (tests/upgrade/previous_release.toml): recorded
as another MAJOR.MINOR than this one, and a checkout without its commit fails the upgrade test
with the fix instead of skipping it."""

from __future__ import annotations

import re

import pytest

import durable_sinks
from durable_sinks.core.formats import interoperate
from tests.support.releases import Release, previous_release, require_history


def test_the_previous_release_is_recorded_as_another_minor_by_its_commit() -> None:
    previous = previous_release()
    assert re.fullmatch(r"[0-9a-f]{40}", previous.commit)
    assert not interoperate(previous.version, durable_sinks.__version__)


def test_a_commit_missing_from_history_fails_with_the_fix() -> None:
    with pytest.raises(AssertionError, match="is not in this checkout's history") as raised:
        require_history(Release("0.0.1", "0" * 40))
    assert "Fix: " in str(raised.value)
    assert "git fetch" in str(raised.value)
