"""The `durable-sinks` command run as an operator would after a driver died past the decision
of epoch 0 (three rows, one staged participant left prepared)."""

from __future__ import annotations

from collections.abc import Sequence

from click.testing import CliRunner

from durable_sinks.cli import main


def resolve_the_decided_leftover(args: Sequence[str]) -> None:
    """`inspect` shows the staged participant and its decision, `resolve --apply` commits
    it, and `verify` then counts the epoch's three rows. `args`: the job and how to reach
    its sinks and store."""
    inspect = CliRunner().invoke(main, ["inspect", *args])
    assert inspect.exit_code == 0, inspect.output
    assert "staging folder" in inspect.output
    assert "decided by generation 1: commit" in inspect.output
    applied = CliRunner().invoke(main, ["resolve", *args, "--apply", "--force"])
    assert applied.exit_code == 0, applied.output
    assert "committed 1, rolled back 0" in applied.output
    verify = CliRunner().invoke(main, ["verify", *args])
    assert verify.exit_code == 0, verify.output
    assert "3 rows counted" in verify.output
