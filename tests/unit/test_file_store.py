"""The local-directory decision store: create-only records, generations that fence, O(1)
lookups, expiry, and loud errors on damage."""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from durable_sinks.core import CommitHandle
from durable_sinks.core.errors import (
    ConfigError,
    FencedError,
    InDoubtError,
    ManifestCorruptError,
    TransientError,
    UsageError,
)
from durable_sinks.manifest import DecisionRecord, LocalDirectoryStore, MemoryDecisionStore
from durable_sinks.manifest._file_store import TEMP_AGE_S
from durable_sinks.manifest._store import DecisionStore


def decision(
    epoch: int, generation: int, participant: str = "p", job: str = "job"
) -> DecisionRecord:
    handle = CommitHandle(
        "files", epoch, f"ds:{job}:files:{epoch}:0:{generation}-0-{participant}", 1, 1, "c"
    )
    return DecisionRecord(job, epoch, generation, (handle,))


def opened(path: Path, job: str = "job") -> LocalDirectoryStore:
    store = LocalDirectoryStore(path)
    store.open(job)
    return store


def test_stores_satisfy_the_protocol(tmp_path: Path) -> None:
    assert isinstance(LocalDirectoryStore(tmp_path), DecisionStore)
    assert isinstance(MemoryDecisionStore(), DecisionStore)
    assert LocalDirectoryStore(tmp_path).durable
    assert not LocalDirectoryStore(tmp_path, fsync=False).durable
    assert not MemoryDecisionStore().durable


def test_put_is_create_only_and_first_wins(tmp_path: Path) -> None:
    store = opened(tmp_path)
    first = decision(5, store.generation, "first")
    assert store.put(first) == first
    second = decision(5, store.generation, "second")
    assert store.put(second) == first
    assert store.get(5) == first
    assert store.get(6) is None


def test_each_open_claims_a_higher_generation_and_fences_the_older(tmp_path: Path) -> None:
    old = opened(tmp_path)
    new = opened(tmp_path)
    assert new.generation == old.generation + 1
    with pytest.raises(FencedError, match="newer coordinator"):
        old.put(decision(1, old.generation))
    assert new.get(1) is None
    new.put(decision(1, new.generation))
    assert old.get(1) == new.get(1)  # a fenced store can still read


def test_decisions_of_a_fenced_generation_are_promoted(tmp_path: Path) -> None:
    old = opened(tmp_path)
    made = decision(1, old.generation)
    old.put(made)
    # Simulate a crash between the commit point (link into the generation folder) and the
    # link into decisions/: remove the latter.
    (tmp_path / "job" / "decisions" / "000000000001.json").unlink()
    new = opened(tmp_path)
    assert new.get(1) == made
    assert new.latest_epoch() == 1


def test_promotion_compares_a_retired_record_with_the_one_decided(tmp_path: Path) -> None:
    """A retired generation's records are mostly the very files in decisions/ (one inode,
    two names): those pass unread; a different record of the same epoch is corruption."""
    old = opened(tmp_path)
    for epoch in range(3):
        old.put(decision(epoch, old.generation))
    mine = f"{old.generation:012d}"
    retired = tmp_path / "job" / "generations" / mine / "decisions" / "000000000002.json"
    assert os.path.samefile(retired, tmp_path / "job" / "decisions" / "000000000002.json")
    again = opened(tmp_path)  # promotes generation 1's records: all already decided
    assert [again.get(e) is not None for e in range(3)] == [True, True, True]
    again.put(decision(3, again.generation))
    (tmp_path / "job" / "decisions" / "000000000003.json").unlink()
    (tmp_path / "job" / "decisions" / "000000000003.json").write_bytes(
        decision(3, again.generation, participant="q").to_bytes()
    )
    with pytest.raises(ManifestCorruptError, match="two different decisions for one epoch"):
        opened(tmp_path)


def test_jobs_are_separate(tmp_path: Path) -> None:
    a, b = opened(tmp_path, "a"), opened(tmp_path, "b")
    a.put(decision(1, a.generation, job="a"))
    assert b.get(1) is None
    assert b.generation == 1
    with pytest.raises(UsageError, match="handed to the store of job b"):
        b.put(decision(2, b.generation, job="a"))


def test_latest_epoch_with_and_without_its_hint(tmp_path: Path) -> None:
    store = opened(tmp_path)
    assert store.latest_epoch() is None
    for epoch in (0, 1, 2, 7):
        store.put(decision(epoch, store.generation))
    assert store.latest_epoch() == 7
    (tmp_path / "job" / "latest").unlink()
    assert store.latest_epoch() == 7
    (tmp_path / "job" / "latest").write_text("garbage")
    assert store.latest_epoch() == 7


def test_expiry_removes_only_finished_records_below_the_bound(tmp_path: Path) -> None:
    store = opened(tmp_path)
    for epoch in range(10):
        store.put(decision(epoch, store.generation))
        if epoch != 4:
            store.mark_finished(epoch)
    assert store.expire(before_epoch=8) == 4  # 0-3; stops at unfinished 4
    assert [store.get(e) is None for e in range(6)] == [True] * 4 + [False] * 2
    store.mark_finished(4)
    assert store.expire(before_epoch=8) == 4  # 4-7
    assert store.get(7) is None
    assert store.get(8) is not None
    assert store.latest_epoch() == 9
    assert store.expire(before_epoch=8) == 0


def test_corrupt_record_is_an_error_naming_the_file(tmp_path: Path) -> None:
    store = opened(tmp_path)
    store.put(decision(3, store.generation))
    path = tmp_path / "job" / "decisions" / "000000000003.json"
    data = path.read_bytes()
    path.unlink()  # the file is a hard link: replace it, do not write through it
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ManifestCorruptError, match=r"000000000003\.json"):
        store.get(3)


def test_unwritable_location_is_a_config_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(ConfigError, match="cannot create the decision store"):
        LocalDirectoryStore(blocker / "store").open("job")


def test_use_before_open_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not open"):
        LocalDirectoryStore(tmp_path).get(1)
    store = opened(tmp_path, "job")
    with pytest.raises(UsageError, match="already open"):
        store.open("job")


def test_lookups_do_not_scan_history(tmp_path: Path) -> None:
    """get(), latest_epoch() and the per-epoch expire() open files by name: with 5,000
    records they list no folder."""
    store = opened(tmp_path)
    for epoch in range(5000):
        store.put(decision(epoch, store.generation))
    calls: list[str] = []
    real_scandir = os.scandir

    def counting_scandir(path: object = ".") -> object:
        calls.append(str(path))
        return real_scandir(path)  # type: ignore[call-overload]

    store.expire(before_epoch=-9000)  # the first expiry in a folder scans once...
    os.scandir = counting_scandir  # type: ignore[assignment]
    try:
        assert store.get(4321) is not None
        assert store.latest_epoch() == 4999
        for epoch in range(5000, 5010):  # ...later ones, like a coordinator's per epoch, never
            store.put(decision(epoch, store.generation))
            store.mark_finished(epoch)
            store.expire(before_epoch=epoch - 10_000)
    finally:
        os.scandir = real_scandir
    assert calls == []


def test_memory_store_fences_too() -> None:
    old = MemoryDecisionStore()
    old.open("job")
    new = MemoryDecisionStore(old.backend)
    new.open("job")
    with pytest.raises(FencedError):
        old.put(decision(1, 1))
    assert new.put(decision(1, 2)) == decision(1, 2)


# -- a disk that fails ----------------------------------------------------------------------------
def failing(monkeypatch: pytest.MonkeyPatch, name: str, code: int, *, after: bool = False) -> None:
    """Make `os.<name>` fail with errno `code`; with `after`, the call takes effect first (an
    answer lost: EIO after the link was made)."""
    real = getattr(os, name)

    def broken(*args: object, **kwargs: object) -> object:
        if after:
            real(*args, **kwargs)
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, name, broken)


@pytest.mark.parametrize("after", [False, True])
def test_an_io_error_at_the_commit_point_is_in_doubt_and_read_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, after: bool
) -> None:
    """EIO from the link that records the decision: the link may exist or not. InDoubtError,
    never 'not decided' and never a raw OSError; the next look reads the truth."""
    store = opened(tmp_path)
    with monkeypatch.context() as patch:
        failing(patch, "link", errno.EIO, after=after)
        with pytest.raises(InDoubtError, match="may or may not be recorded"):
            store.put(decision(0, store.generation))
    assert (store.get(0) is not None) is after
    assert list(tmp_path.rglob(".tmp-*")) == []


@pytest.mark.parametrize(
    ("call", "os_name", "code"),
    [
        ("get", "read", "EIO"),
        ("mark_finished", "open", "ENOSPC"),
        ("expire", "unlink", "EACCES"),
        ("put", "open", "ENOSPC"),
    ],
)
def test_a_failing_disk_is_a_typed_error_never_a_missing_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: str, os_name: str, code: str
) -> None:
    store = opened(tmp_path)
    store.put(decision(0, store.generation))
    store.mark_finished(0)
    if os_name == "read":
        number = errno.EIO

        def unreadable(self: Path) -> bytes:
            raise OSError(number, os.strerror(number))

        monkeypatch.setattr(Path, "read_bytes", unreadable)
    else:
        failing(monkeypatch, os_name, getattr(errno, code))
    calls: dict[str, Callable[[], object]] = {
        "get": lambda: store.get(0),
        "mark_finished": lambda: store.mark_finished(1),
        "expire": lambda: store.expire(1),
        "put": lambda: store.put(decision(1, store.generation)),
    }
    with pytest.raises(TransientError, match=code) as raised:
        calls[call]()
    assert "decision store" in str(raised.value)
    assert raised.value.fix


def test_a_crashed_writers_temporary_files_are_swept_at_open(tmp_path: Path) -> None:
    store = opened(tmp_path)
    store.put(decision(0, store.generation))
    home = next(p for p in tmp_path.iterdir() if p.is_dir())
    old, fresh = home / ".tmp-crashed", home / ".tmp-being-written"
    for temp in (old, fresh):
        temp.write_bytes(b"half a record")
    long_ago = os.stat(old).st_mtime - TEMP_AGE_S - 60
    os.utime(old, (long_ago, long_ago))
    opened(tmp_path)
    assert not old.exists()
    assert fresh.exists()  # may be a live writer's
    store.mark_finished(0)
    assert [p.name for p in (home / "finished").iterdir()] == ["000000000000"]  # no temp made


def test_the_store_logs_its_generation_a_lost_race_and_expiry_with_the_job(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Every decision store logs through the jobs' logger: the job on the line and in the
    record's extras (manifest/_store.py)."""
    caplog.set_level(logging.DEBUG, logger="durable_sinks")
    store = LocalDirectoryStore(tmp_path)
    generation = store.open("orders")
    first = DecisionRecord("orders", 0, generation, ())
    assert store.put(first) is first
    again = DecisionRecord("orders", 0, generation, (), source="another")
    assert store.put(again) == first
    store.mark_finished(0)
    assert store.expire(before_epoch=1) == 1
    lines = [
        (r.name, r.levelname, r.getMessage(), getattr(r, "ds_job", None)) for r in caplog.records
    ]
    name = "durable_sinks.manifest.LocalDirectoryStore"
    assert (
        name,
        "INFO",
        f"job=orders sink=- epoch=-: claimed generation {generation} in {store!r}",
        "orders",
    ) in lines
    assert (
        name,
        "DEBUG",
        "job=orders sink=- epoch=0: decision recorded: 0 participant(s)",
        "orders",
    ) in lines
    assert any(
        n == name and level == "INFO" and "decided before" in m for n, level, m, _ in lines
    ), lines
    assert (
        name,
        "INFO",
        "job=orders sink=- epoch=-: expired 1 finished decision(s) of epochs below 1",
        "orders",
    ) in lines
