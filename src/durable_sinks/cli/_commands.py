"""`durable-sinks`: status, inspect, resolve, verify, doctor, expire, repair-epochs and drop
for a job (docs/operations.md). Every command takes the job's settings as `durable_sink(...)`
does (`-f job.toml`, or `--kind` and `-o key=value`, `--store`), secrets from the environment.

Exit codes: 0 fine; 1 a check failed (verify found a mismatch, doctor a failing check,
resolve left something); 2 refused or misused (bad settings, a running job without --force).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from durable_sinks.core.errors import DropRefusedError, DurableSinkError

from ._jobfile import job_settings
from ._operator import DEFAULT_LIVE_WINDOW_S, Operator

#: Width of output that is not a terminal (a pipe, a file, a log): wide enough that tables
#: of participant names and object keys are not cut.
PIPE_WIDTH = 250


class _Console:
    """rich's Console, made at each use: the command's output may be redirected after import
    (tests, wrappers); a terminal gets its own width, anything else PIPE_WIDTH."""

    def __init__(self, stderr: bool = False) -> None:
        self.stderr = stderr

    def print(self, *objects: Any, markup: bool = False) -> None:
        stream = sys.stderr if self.stderr else sys.stdout
        width = None if stream.isatty() else PIPE_WIDTH
        console = Console(file=stream, highlight=False, width=width, markup=markup)
        console.print(*objects)


out = _Console()
err = _Console(stderr=True)


def _job_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The options every command takes to know the job."""
    for option in reversed(
        [
            click.argument("job_id"),
            click.option(
                "-f", "--job-file", type=click.Path(path_type=Path), help="TOML or JSON job file"
            ),
            click.option("--kind", help="the sink's kind (one-sink jobs, without a job file)"),
            click.option(
                "-o", "--option", "options", multiple=True, help="a sink or job option key=value"
            ),
            click.option("--store", help="the decision store (as decision_store=)"),
        ]
    ):
        command = option(command)
    return command


def _liveness_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--force and --live-window: the commands that must not act while the job runs."""
    for option in reversed(
        [
            click.option(
                "--force", is_flag=True, help="even while a coordinator of the job seems to run"
            ),
            click.option(
                "--live-window",
                type=float,
                default=DEFAULT_LIVE_WINDOW_S,
                show_default=True,
                help="seconds since the newest generation's last decision within which it "
                "counts as running",
            ),
        ]
    ):
        command = option(command)
    return command


@contextmanager
def _operator(params: dict[str, Any]) -> Iterator[Operator]:
    try:
        specs, options = job_settings(
            params["job_id"],
            params["job_file"],
            params["kind"],
            params["options"],
            params["store"],
        )
        with Operator(specs, options) as operator:
            yield operator
    except DurableSinkError as exc:
        _fail(exc)


def _fail(exc: DurableSinkError, code: int = 2) -> None:
    # The message is text, not markup: "[job=orders]" and "durable-sinks[kafka]" must show.
    err.print(f"[bold red]error:[/] {type(exc).__name__}: {escape(str(exc))}", markup=True)
    raise SystemExit(code)


def _when(at: float | None) -> str:
    if at is None:
        return "-"
    age = time.time() - at
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))
    return f"{stamp} ({_age(age)} ago)"


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _size(size: int | None) -> str:
    return "-" if size is None else f"{size:,} B"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="durable-sinks")
def main() -> None:
    """Operate durable-sinks jobs: what they hold, what is in doubt, and proof that every
    batch landed once."""


@main.command()
@_job_options
def status(**params: Any) -> None:
    """Per sink: the last committed epoch and when; the generation, decision store, epochs in
    flight."""
    with _operator(params) as op:
        state = op.status()
    out.print(f"job {state.job}")
    out.print(f"decision store   {state.store}")
    out.print(
        f"generation       {state.generation} ({state.live or 'no coordinator seen running'})"
    )
    out.print(f"latest decision  epoch {state.latest_decision} at {_when(state.decided_at)}")
    if state.stream is not None:
        first = "" if state.first_epoch is None else f", its first epoch {state.first_epoch}"
        out.print(f"stream           {state.stream}{first}")
    if state.latest_decision is not None:
        out.print(
            f"a new stream     continues with first_epoch={state.latest_decision + 1} "
            "(a query moved to a new checkpoint)"
        )
    out.print(f"epochs in flight {', '.join(map(str, state.in_flight)) or 'none'}")
    table = Table("sink", "kind", "last committed epoch", "committed at", "in doubt")
    for s in state.sinks:
        table.add_row(
            s.name,
            s.kind,
            "-" if s.last_committed is None else str(s.last_committed),
            _when(s.at),
            "?" if s.in_doubt is None else str(s.in_doubt),
        )
    out.print(table)


def _doubt_table(op: Operator, verb: str | None = None) -> int:
    doubts = op.inspect()
    table = Table("sink", "epoch", "participant", "what", "age", "size", "decision")
    if verb:
        table.add_column(verb)
    for d in doubts:
        row = [
            d.sink,
            str(d.prepared.handle.epoch),
            d.prepared.handle.participant,
            d.prepared.what,
            _age(d.prepared.age_s),
            _size(d.prepared.size_bytes),
            d.governed_by,
        ]
        table.add_row(*row, *([d.action] if verb else []))
    if doubts:
        out.print(table)
    else:
        out.print("nothing in doubt")
    for name in op.not_inspectable():
        out.print(f"sink {name}: not inspectable (its kind does not implement OperableSink)")
    return len(doubts)


@main.command()
@_job_options
@click.option(
    "--epochs",
    type=click.IntRange(min=0),
    default=10,
    show_default=True,
    help="how many of the latest decided epochs to list dead letters of",
)
def inspect(epochs: int, **params: Any) -> None:
    """What is in doubt: prepared participants of the job, each with the decision that
    governs it (or "none: presumed abort"); then the rows sinks refused that the latest
    epochs committed into the dead-letter sink, per epoch, sink and reason."""
    with _operator(params) as op:
        _doubt_table(op)
        letters = op.dead_letters(epochs) if epochs else []
    if letters:
        table = Table("epoch", "sink", "reason", "dead letters")
        for epoch, sink, reason, n in letters:
            table.add_row(str(epoch), sink, reason, f"{n:,}")
        out.print(table)
    elif epochs and op.options.dead_letter is not None:
        out.print(f"no dead letters in the latest {epochs} decided epochs")


@main.command()
@_job_options
@click.option("--apply", "apply_", is_flag=True, help="act (default: a dry run)")
@_liveness_options
def resolve(apply_: bool, force: bool, live_window: float, **params: Any) -> None:
    """Apply the decisions: commit what was decided, roll back the rest. A dry run unless
    --apply; refuses while a coordinator of the job's current generation runs, unless
    --force (which fences it: its batch fails and Spark retries it)."""
    with _operator(params) as op:
        found = _doubt_table(op, "would" if not apply_ else "action")
        if not apply_:
            out.print(f"dry run: {found} participant(s) would be resolved; nothing was changed")
            return
        live = op.live(live_window)
        if live and not force:
            err.print(
                f"refused: a coordinator of job {op.job} seems to run ({live}); resolving would "
                "fence it. Stop the query first, or give --force"
            )
            raise SystemExit(2)
        try:
            report = op.resolve()
        except DurableSinkError as exc:
            _fail(exc, 1)
    for handle in report.committed:
        out.print(f"committed   {handle.sink} {handle.participant}")
    for handle in report.rolled_back:
        out.print(f"rolled back {handle.sink} {handle.participant}")
    out.print(f"resolved: {report}")


@main.command()
@_job_options
@click.option("--from", "first", type=int, help="first epoch (default: the oldest held)")
@click.option("--to", "last", type=int, help="last epoch (default: the latest decided)")
def verify(first: int | None, last: int | None, **params: Any) -> None:
    """The exactly-once audit: per epoch and sink, the decision against the sink's markers and
    data. Exits 1 on any mismatch."""
    with _operator(params) as op:
        verdict = op.verify(first, last)
    table = Table("epoch", "sink", "decision", "sink holds", "verdict")
    for check in verdict.checks:
        result = "ok" if check.ok else "MISMATCH: " + "; ".join(check.problems)
        table.add_row(str(check.epoch), check.sink, check.decided, check.held, result)
    out.print(table)
    failed = verdict.failed
    epochs = sorted({c.epoch for c in failed})
    span = f"epochs {verdict.first}..{verdict.last}" if verdict.first is not None else "no epochs"
    if failed:
        out.print(f"verify FAILED: {len(failed)} mismatch(es) in epoch(s) {epochs} ({span})")
        raise SystemExit(1)
    out.print(f"verify passed: {span}, {len(verdict.checks)} checks")


@main.command()
@_job_options
@click.option("--read-only", is_flag=True, help="skip the checks that claim a generation")
def doctor(read_only: bool, **params: Any) -> None:
    """Every check `durable_sink(...)` runs at start, without starting a query."""
    from ._doctor import run_checks

    failures = 0
    for name, problem, informational in run_checks(params, read_only=read_only):
        if informational:
            out.print(f"info    {name}")
        elif problem is None:
            out.print(f"ok      {name}")
        else:
            failures += 1
            out.print(f"FAILED  {name}: {problem}")
    if failures:
        out.print(f"doctor: {failures} check(s) failed")
        raise SystemExit(1)
    out.print("doctor: every check passed")


@main.command()
@_job_options
@click.option("--keep", type=int, default=None, help="epochs of markers to keep (retain_epochs)")
def expire(keep: int | None, **params: Any) -> None:
    """Delete the sinks' per-epoch bookkeeping (markers) of epochs more than --keep behind the
    last committed one (never the newest). A running job does the same itself beyond
    retain_epochs, and expires its decisions too."""
    with _operator(params) as op:
        kept = keep if keep is not None else op.options.retain_epochs
        if kept < 1:
            err.print("--keep must be at least 1")
            raise SystemExit(2)
        deleted = op.expire(kept)
    for sink, count in deleted.items():
        shown = "keeps no markers to expire" if count < 0 else f"deleted {count} record(s)"
        out.print(f"{sink}: {shown} (kept the newest {kept} epochs)")


@main.command("repair-epochs")
@_job_options
@click.option("--sink", "sink_name", required=True, help="the sink that lost epochs")
@click.option(
    "--from",
    "source",
    help="the old server's data to copy the lost epochs from (for Postgres a DSN of the old "
    "primary started alone; ${env:NAME} for a password)",
)
@click.option(
    "--record-loss",
    is_flag=True,
    help="no copy exists: record the epochs up to --through as lost (after re-supplying "
    "their rows from the source)",
)
@click.option("--through", type=click.IntRange(min=0), help="the last lost epoch (--record-loss)")
@click.option("--note", default="", help="who records the loss and why (--record-loss)")
@click.option("--apply", "apply_", is_flag=True, help="act (default: a dry run)")
@click.option("--force", is_flag=True, help="even while a coordinator of the job seems to run")
def repair_epochs(
    sink_name: str,
    source: str | None,
    record_loss: bool,
    through: int | None,
    note: str,
    apply_: bool,
    force: bool,
    **params: Any,
) -> None:
    """Put back committed epochs a sink lost (CommittedEpochLostError): copy them from the
    old server's data (--from), or record them as lost (--record-loss --through N). A dry
    run unless --apply; refuses while a coordinator of the job seems to run, unless --force
    (docs/reliability.md, "Lost committed epochs")."""
    if (source is None) == (not record_loss) or (record_loss and through is None):
        err.print("give either --from SOURCE, or --record-loss with --through EPOCH")
        raise SystemExit(2)
    with _operator(params) as op:
        live = op.live() if apply_ else None
        if live and not force:
            err.print(
                f"refused: a coordinator of job {op.job} seems to run ({live}); stop the query "
                "before repairing its sinks, or give --force"
            )
            raise SystemExit(2)
        try:
            if source is not None:
                repairs = op.copy_lost_epochs(sink_name, source, apply=apply_)
            else:
                assert through is not None
                who = note or "recorded by durable-sinks repair-epochs"
                repairs = op.record_lost_epochs(sink_name, through, who, apply=apply_)
        except DurableSinkError as exc:
            _fail(exc, 1)
    table = Table("epoch", "parts", "rows", "how")
    for repair in repairs:
        table.add_row(str(repair.epoch), str(repair.parts), f"{repair.rows:,}", repair.action)
    if repairs:
        out.print(table)
    verb = "repaired" if apply_ else "dry run: would repair"
    out.print(f"{verb} {len(repairs)} epoch(s) of sink {sink_name}")
    if repairs and not apply_:
        out.print("nothing was changed; give --apply to act")


@main.command()
@_job_options
@click.option("--apply", "apply_", is_flag=True, help="remove (default: a dry run)")
@_liveness_options
@click.option(
    "--epoch-markers",
    is_flag=True,
    help="also remove the S3 and files epoch markers (readers reading through markers then "
    "find no committed epoch)",
)
def drop(apply_: bool, force: bool, live_window: float, epoch_markers: bool, **params: Any) -> None:
    """Retire a job: remove what it keeps for itself in every sink and in its decision store
    (markers, fence and generation records, decisions, progress records, _job.json, staging
    leftovers), never the committed data. A dry run unless --apply; refuses while anything
    of the job is in doubt (resolve it first) or, with --apply, a coordinator of it seems to
    run (unless --force)."""
    with _operator(params) as op:
        try:
            plan = op.drop(
                apply=apply_, live_window=live_window, force=force, epoch_markers=epoch_markers
            )
        except DropRefusedError as exc:
            _doubt_table(op)
            _fail(exc, 2)
        except DurableSinkError as exc:
            _fail(exc, 1)
    verb = "removed" if apply_ else "would remove"
    table = Table("sink", "what", "where", "count", verb)
    for d in plan.found:
        count = "-" if d.item.count is None else f"{d.item.count:,}"
        shown = "yes" if d.item.removable else f"kept: {d.item.kept}"
        table.add_row(d.target, d.item.what, d.item.where, count, shown)
    if plan.found:
        out.print(table)
    for target, why in plan.by_hand:
        out.print(f"{target}: {why}")
    removable = len(plan.removable)
    if apply_:
        out.print(
            f"dropped job {op.job}: removed {removable} kind(s) of bookkeeping, kept "
            f"{len(plan.kept)}; the committed data is untouched"
        )
    else:
        out.print(
            f"dry run: {removable} kind(s) of bookkeeping of job {op.job} would be "
            "removed; nothing was changed (give --apply to remove them)"
        )
