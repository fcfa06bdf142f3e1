"""What a start of the Kafka sink reads from the progress topic (progress.py): the latest
progress record of the job's sink (its last committed epoch, and the decision a commit
carried) and the latest fence record (the newest generation that opened the sink).

Nothing is left prepared to resolve: a Kafka transaction cannot outlive its producer, and the
next producer of the same transactional.id aborts whatever an older one left open
(`init_transactions`, when the sink opens)."""

from __future__ import annotations

from collections.abc import Callable

from .progress import ProgressReader, ProgressRecord, decode_fence, fence_key, progress_key


def _any(value: bytes, offset: int) -> bool:
    return True


def latest_progress(
    progress: ProgressReader,
    job_id: str,
    sink: str,
    topic: str,
    accept: Callable[[ProgressRecord], bool],
    *,
    with_fence: bool = False,
    committed: bool = True,
) -> tuple[ProgressRecord | None, tuple[int, bytes] | None]:
    """The latest progress record of the job's sink that `accept`s and, in the same scan
    when `with_fence`, the latest fence record (offset, value); with `committed=False`,
    records of open and aborted transactions count too (ProgressReader.latest)."""
    key = progress_key(job_id, sink)
    fence = fence_key(job_id, sink)
    decoded: dict[int, ProgressRecord] = {}

    def check(value: bytes, offset: int) -> bool:
        decoded[offset] = ProgressRecord.decode(value, f"{topic}@{offset}")
        return accept(decoded[offset])

    want: dict[bytes, Callable[[bytes, int], bool]] = {key: check}
    if with_fence:
        want[fence] = _any
    found = progress.latest(want, committed=committed)
    record = decoded[found[key][0]] if key in found else None
    return record, found.get(fence) if with_fence else None


def last_committed(progress: ProgressReader, job_id: str, sink: str, topic: str) -> int | None:
    """The epoch of the latest progress record: the last committed one."""
    record, _ = latest_progress(progress, job_id, sink, topic, lambda r: True)
    return record.epoch if record is not None else None


def fence_holder(
    progress: ProgressReader, job_id: str, sink: str, topic: str
) -> tuple[int, bytes] | None:
    """The latest fence record (offset, value) of the job's sink, if any."""
    fence = fence_key(job_id, sink)
    return progress.latest({fence: _any}).get(fence)


def holder(found: tuple[int, bytes] | None, topic: str) -> int | None:
    """The generation in a fence record (offset, value), if any."""
    if found is None:
        return None
    return decode_fence(found[1], f"{topic}@{found[0]}")
