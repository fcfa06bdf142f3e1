"""The S3 decision store against the test bed's SeaweedFS (no mock of S3): create-only records,
generations fenced per epoch slot, O(1) lookups, expiry, typed errors, and the conformance
suite with the file sink.

Faults are injected into the store's own boto3 client (the one its S3Connection caches for
the process) through botocore's event hooks: a server that drops the conditional headers, a
request lost in transit. Every hook is removed again when the test ends."""

from __future__ import annotations

import shutil
import tempfile
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.awsrequest import AWSPreparedRequest
from botocore.exceptions import ConnectionClosedError
from botocore.httpsession import URLLib3Session

from durable_sinks.clients.s3 import S3Connection, S3Location
from durable_sinks.core import CommitHandle
from durable_sinks.core.errors import (
    ConfigError,
    FencedError,
    InDoubtError,
    ManifestCorruptError,
    StoredFormatError,
    UnreachableError,
)
from durable_sinks.manifest import DecisionRecord, DecisionStore, default_store_for, store_from
from durable_sinks.manifest.s3 import CLAIM_MAX_BYTES, S3DecisionStore
from durable_sinks.testing import Scenario, run_conformance
from tests.crash.test_file_sink_conformance import check_exercised
from tests.services import S3Endpoint
from tests.support.s3_faults import fail_request
from tests.support.targets import FileTarget
from tests.support.tiers import CONFORMANCE_SAMPLE


def connection_of(s3: S3Endpoint, **changes: Any) -> S3Connection:
    settings: dict[str, Any] = {
        "endpoint_url": s3.endpoint_url,
        "region": s3.region,
        "access_key_id": s3.access_key_id,
        "secret_access_key": s3.secret_access_key,
        "addressing_style": "path",
        "connect_timeout_s": 2.0,
        "request_timeout_s": 10.0,
    }
    settings.update(changes)
    return S3Connection(**settings)


@pytest.fixture
def connection(s3: S3Endpoint) -> S3Connection:
    return connection_of(s3)


@pytest.fixture
def location(s3: S3Endpoint, s3_prefix: str) -> S3Location:
    return S3Location(s3.bucket, s3_prefix.rstrip("/") + "/decisions")


@pytest.fixture
def hooks(connection: S3Connection) -> Iterator[Callable[[str, Callable[..., Any]], None]]:
    """Register a botocore event hook on the store's cached client, for this test only."""
    registered: list[tuple[str, Callable[..., Any]]] = []
    events = connection.client().meta.events

    def register(event: str, handler: Callable[..., Any]) -> None:
        events.register(event, handler)
        registered.append((event, handler))

    yield register
    for event, handler in registered:
        events.unregister(event, handler)


def decision(
    epoch: int, generation: int, participant: str = "p", job: str = "job"
) -> DecisionRecord:
    handle = CommitHandle(
        "files", epoch, f"ds:{job}:files:{epoch}:0:{generation}-0-{participant}", 1, 1, "c"
    )
    return DecisionRecord(job, epoch, generation, (handle,))


def opened(location: S3Location, connection: S3Connection, job: str = "job") -> S3DecisionStore:
    store = S3DecisionStore(location, connection)
    store.open(job)
    return store


def keys_under(s3: S3Endpoint, prefix: str) -> list[str]:
    client = s3.client()
    found: list[str] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=s3.bucket, Prefix=prefix):
        found += [item["Key"] for item in page.get("Contents", [])]
    return found


# -- the contract ---------------------------------------------------------------------------------


def test_the_store_satisfies_the_protocol(location: S3Location, connection: S3Connection) -> None:
    store = S3DecisionStore(location, connection)
    assert isinstance(store, DecisionStore)
    assert store.durable
    assert "s3://" in repr(store)
    secret = connection.secret_access_key or ""
    assert secret
    assert secret not in repr(store)


def test_put_is_create_only_and_first_wins(location: S3Location, connection: S3Connection) -> None:
    store = opened(location, connection)
    first = decision(5, store.generation, "first")
    assert store.put(first) == first
    second = decision(5, store.generation, "second")
    assert store.put(second) == first
    assert store.get(5) == first
    assert store.get(6) is None
    again = opened(location, connection)
    assert again.get(5) == first
    assert again.put(decision(5, again.generation, "third")) == first


def test_each_open_claims_a_higher_generation(
    location: S3Location, connection: S3Connection
) -> None:
    stores = [opened(location, connection) for _ in range(3)]
    assert [s.generation for s in stores] == [1, 2, 3]
    assert S3DecisionStore(location, connection).peek_generation("job") == 3
    assert S3DecisionStore(location, connection).peek_generation("other") == 0


def test_a_zombie_cannot_decide_an_epoch_the_newer_generation_looked_up(
    location: S3Location, connection: S3Connection, s3: S3Endpoint
) -> None:
    old = opened(location, connection)
    assert old.get(1) is None  # the old one claims the epoch (it is about to decide it)
    new = opened(location, connection)
    assert new.get(1) is None  # recovery looks it up: the claim is now the new generation's
    with pytest.raises(FencedError, match="generation 2 of the job took over"):
        old.put(decision(1, old.generation))
    with pytest.raises(FencedError):  # a lookup by the zombie is refused as well
        old.get(1)
    assert new.get(1) is None  # nothing was added
    body = (
        s3.client()
        .get_object(Bucket=s3.bucket, Key=f"{location.prefix}/job/decisions/000000000001.json")[
            "Body"
        ]
        .read()
    )
    assert b"durable-sinks/claim" in body
    made = decision(1, new.generation)
    assert new.put(made) == made
    assert old.get(1) == made  # a fenced store can still read a decision


def test_a_zombie_cannot_decide_an_epoch_the_newer_generation_never_saw(
    location: S3Location, connection: S3Connection
) -> None:
    """put reads the generation object first: a zombie's put that starts after the newer
    open is refused even for an epoch the newer generation has not looked up."""
    old = opened(location, connection)
    assert old.get(7) is None
    new = opened(location, connection)
    with pytest.raises(FencedError, match="this decision was not recorded"):
        old.put(decision(7, old.generation))
    assert new.get(7) is None


def test_a_zombies_decision_made_before_the_newer_lookup_wins(
    location: S3Location, connection: S3Connection, hooks: Callable[..., None]
) -> None:
    """The window the weaker guarantee leaves: the zombie's put read the generation object
    before the newer open and writes after it. Its decision stands and the newer generation
    finds it (and would finish the epoch)."""
    old = opened(location, connection)
    assert old.get(3) is None
    newer: list[S3DecisionStore] = []

    def open_newer_before_the_decision(request: AWSPreparedRequest, **_: Any) -> None:
        slot = request.method == "PUT" and request.url.endswith("decisions/000000000003.json")
        if slot and not newer:
            newer.append(opened(location, connection))

    hooks("before-send.s3.PutObject", open_newer_before_the_decision)
    made = decision(3, old.generation)
    assert old.put(made) == made
    assert newer, "the hook did not run"
    assert newer[0].generation == old.generation + 1
    assert newer[0].get(3) == made
    assert newer[0].put(decision(3, newer[0].generation, "mine")) == made


def test_concurrent_opens_get_distinct_generations(
    location: S3Location, connection: S3Connection
) -> None:
    claimed: list[int] = []
    errors: list[BaseException] = []

    def claim() -> None:
        try:
            claimed.append(opened(location, connection).generation)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=claim) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert sorted(claimed) == list(range(1, 9))


def test_racing_coordinators_agree_on_one_decision(
    location: S3Location, connection: S3Connection
) -> None:
    """Coordinators start one after another and race for one epoch (open, get, put): each
    either gets the one stored decision back or is fenced, and the stored decision is one
    of theirs."""
    results: list[DecisionRecord | FencedError] = []
    lock = threading.Lock()

    def race() -> None:
        store = opened(location, connection)
        try:
            store.get(9)
            outcome: DecisionRecord | FencedError = store.put(
                decision(9, store.generation, f"g{store.generation}")
            )
        except FencedError as exc:
            outcome = exc
        with lock:
            results.append(outcome)

    threads = [threading.Thread(target=race) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 6
    stored = opened(location, connection).get(9)
    decided = [r for r in results if isinstance(r, DecisionRecord)]
    assert all(r == stored for r in decided), (stored, decided)
    if stored is not None:
        assert decided, "a decision was stored but no racer was told it won"
        assert stored.handles[0].participant.endswith(f"g{stored.generation}")


def test_jobs_are_separate(location: S3Location, connection: S3Connection) -> None:
    a, b = opened(location, connection, "a"), opened(location, connection, "b")
    assert a.generation == b.generation == 1
    a.put(decision(1, a.generation, job="a"))
    assert b.get(1) is None
    assert a.latest_epoch() == 1
    assert b.latest_epoch() is None


def test_a_damaged_record_is_manifest_corrupt_naming_the_key(
    location: S3Location, connection: S3Connection, s3: S3Endpoint
) -> None:
    store = opened(location, connection)
    store.put(decision(4, store.generation))
    key = f"{location.prefix}/job/decisions/000000000004.json"
    data = s3.client().get_object(Bucket=s3.bucket, Key=key)["Body"].read()
    s3.client().put_object(Bucket=s3.bucket, Key=key, Body=data[:-40])
    with pytest.raises(ManifestCorruptError, match=key):
        opened(location, connection).get(4)
    s3.client().put_object(Bucket=s3.bucket, Key=key, Body=b'{"format": "durable-sinks/claim"}')
    with pytest.raises(ManifestCorruptError, match="a claim without a valid generation"):
        opened(location, connection).get(4)
    generation = f"{location.prefix}/job/generation.json"
    s3.client().put_object(Bucket=s3.bucket, Key=generation, Body=b"garbage")
    with pytest.raises(ManifestCorruptError, match="not a durable-sinks generation object"):
        S3DecisionStore(location, connection).open("job")


def test_the_previous_releases_layout_is_read_and_a_newer_one_refused(
    location: S3Location, connection: S3Connection, s3: S3Endpoint
) -> None:
    """generation.json and the claims carry the layout's version; the previous release
    wrote none (version 1)."""
    client = s3.client()
    generation = f"{location.prefix}/job/generation.json"
    claim = f"{location.prefix}/job/decisions/000000000005.json"
    opened(location, connection).close()
    # As the previous release wrote them: no version.
    client.put_object(
        Bucket=s3.bucket,
        Key=generation,
        Body=b'{"claimant":"c","format":"durable-sinks/generation","generation":3}',
    )
    client.put_object(
        Bucket=s3.bucket, Key=claim, Body=b'{"format":"durable-sinks/claim","generation":3}'
    )
    store = opened(location, connection)
    assert store.generation == 4
    assert store.get(5) is None
    store.close()
    client.put_object(
        Bucket=s3.bucket,
        Key=claim,
        Body=b'{"format":"durable-sinks/claim","generation":4,"version":2}',
    )
    with pytest.raises(StoredFormatError, match="S3 decision store layout version 2"):
        opened(location, connection).get(5)
    client.put_object(
        Bucket=s3.bucket,
        Key=generation,
        Body=b'{"format":"durable-sinks/generation","generation":9,"version":2}',
    )
    with pytest.raises(StoredFormatError, match=r"generation\.json: S3 decision store layout"):
        S3DecisionStore(location, connection).open("job")


def test_claims_and_records_are_told_apart_by_size() -> None:
    """latest_epoch and expire rely on it: the smallest possible record is far above the
    claim size limit, the largest claim far below."""
    smallest = DecisionRecord("", 0, 0, (), created_at=0.0)
    assert len(smallest.to_bytes()) > CLAIM_MAX_BYTES + 40
    claim = b'{"format":"durable-sinks/claim","generation":999999999999999,"version":1}'
    assert len(claim) < CLAIM_MAX_BYTES - 40


def test_expire_deletes_finished_records_only(
    location: S3Location, connection: S3Connection, s3: S3Endpoint
) -> None:
    store = opened(location, connection)
    for epoch in range(10):
        store.get(epoch)
        store.put(decision(epoch, store.generation))
        if epoch != 6:
            store.mark_finished(epoch)
    assert store.get(10) is None  # a claim of an undecided epoch
    assert store.is_finished(3)
    assert not store.is_finished(6)
    assert store.expire(4) == 4
    assert [store.get(e) for e in range(4)] == [None] * 4  # re-claimed, not decided
    assert store.get(4) is not None
    assert store.expire(4) == 0
    assert store.expire(9) == 2  # 4 and 5; stops at 6, unfinished
    assert store.get(6) is not None
    store.mark_finished(6)
    assert store.expire(9) == 3  # 6, 7, 8
    assert store.get(9) is not None
    # A new store starts from the watermark hint, or the oldest slot when there is none.
    again = opened(location, connection)
    assert again.expire(10) == 1
    folder = f"{location.prefix}/job/"
    left = {k.removeprefix(folder) for k in keys_under(s3, folder)}
    assert not {k for k in left if k.startswith("finished/")}
    decided = {k for k in left if k.startswith("decisions/")}
    assert "decisions/000000000010.json" in decided  # the claim stays


def test_latest_epoch(location: S3Location, connection: S3Connection, s3: S3Endpoint) -> None:
    store = opened(location, connection)
    assert store.latest_epoch() is None
    store.put(decision(0, store.generation))
    assert store.get(1) is None  # a claim above the latest record does not count
    assert store.latest_epoch() == 0
    for epoch in (1, 2, 5):
        store.put(decision(epoch, store.generation))
    assert store.latest_epoch() == 5
    other = opened(location, connection)  # from the hint, then listing upwards
    assert other.latest_epoch() == 5
    other.put(decision(7, other.generation))
    assert store.latest_epoch() == 7  # a record of another coordinator is seen
    # A lost hint: found by listing, and written again.
    s3.client().delete_object(Bucket=s3.bucket, Key=f"{location.prefix}/job/latest")
    assert opened(location, connection).latest_epoch() == 7
    hint = s3.client().get_object(Bucket=s3.bucket, Key=f"{location.prefix}/job/latest")
    assert hint["Body"].read() == b"7"


def test_lookups_do_not_scan_history(
    location: S3Location, connection: S3Connection, hooks: Callable[..., None]
) -> None:
    """Requests per call stay the same whatever the history: get 2 (read, claim), put 2
    (the generation object, the record) plus a hint every 100 epochs, latest_epoch 1 list."""
    store = opened(location, connection)
    sent: Counter[str] = Counter()
    hooks("before-send.s3.*", lambda event_name, **_: sent.update([event_name.split(".")[-1]]))

    def epoch_costs(epoch: int) -> dict[str, Counter[str]]:
        costs: dict[str, Counter[str]] = {}
        for name, call in (
            ("get", lambda: store.get(epoch)),
            ("latest", store.latest_epoch),
            ("put", lambda: store.put(decision(epoch, store.generation))),
            ("finish", lambda: store.mark_finished(epoch)),
            ("expire", lambda: store.expire(epoch - 3)),
        ):
            sent.clear()
            call()
            costs[name] = Counter(sent)
        return costs

    early = [epoch_costs(e) for e in range(5, 10)]
    for epoch in range(10, 250):
        store.get(epoch)
        store.put(decision(epoch, store.generation))
        store.mark_finished(epoch)
    late = [epoch_costs(e) for e in range(251, 256)]
    print("requests per call, epoch 255:", late[-1])
    steady = late[-1]
    assert steady["get"] == Counter(GetObject=1, PutObject=1)
    assert steady["put"] == Counter(GetObject=1, PutObject=1)
    assert steady["latest"] == Counter(ListObjectsV2=1)
    assert steady["finish"] == Counter(PutObject=1)
    for costs in late:
        assert sum(costs["get"].values()) == 2
        assert sum(costs["put"].values()) <= 3  # a hint every 100 epochs
        assert costs["latest"] == Counter(ListObjectsV2=1)
    assert sum(early[-1]["get"].values()) == sum(steady["get"].values())
    # The first expiry after 240 unexpired epochs lists them once, in a page or so; the
    # following ones cost the same as before.
    assert sum(late[-1]["expire"].values()) <= 4


# -- faults and settings --------------------------------------------------------------------------


def test_an_unreachable_server_is_unreachable_error(location: S3Location, s3: S3Endpoint) -> None:
    connection = connection_of(s3, endpoint_url="http://127.0.0.1:9", connect_timeout_s=1.0)
    with pytest.raises(UnreachableError, match="unreachable") as raised:
        S3DecisionStore(location, connection).open("job")
    assert "127.0.0.1:9" in str(raised.value)


def test_a_wrong_secret_is_a_config_error_without_the_secret(
    location: S3Location, s3: S3Endpoint
) -> None:
    secret = "wrong-secret-" + uuid.uuid4().hex
    connection = connection_of(s3, secret_access_key=secret)
    with pytest.raises(ConfigError) as raised:
        S3DecisionStore(location, connection).open("job")
    text = str(raised.value) + repr(raised.value) + repr(connection)
    assert secret not in text
    assert raised.value.fix
    assert "SignatureDoesNotMatch" in str(raised.value) or "AccessDenied" in str(raised.value)


def test_a_missing_bucket_is_a_config_error(s3: S3Endpoint, connection: S3Connection) -> None:
    location = S3Location("no-such-bucket-" + uuid.uuid4().hex[:8], "decisions")
    with pytest.raises(ConfigError, match="NoSuchBucket") as raised:
        S3DecisionStore(location, connection).open("job")
    assert "durable-sinks never creates buckets" in (raised.value.fix or "")


def test_a_server_that_ignores_conditional_writes_is_refused_at_open(
    location: S3Location, connection: S3Connection, hooks: Callable[..., None], s3: S3Endpoint
) -> None:
    """A fault-injecting wrapper around the real client drops the conditional headers before
    each PUT is signed, as a server (or proxy) that ignores them would."""

    def drop_conditions(request: Any, **_: Any) -> None:
        for header in ("If-None-Match", "If-Match"):
            if header in request.headers:
                del request.headers[header]

    hooks("before-sign.s3.PutObject", drop_conditions)
    with pytest.raises(ConfigError, match="does not honour conditional writes") as raised:
        S3DecisionStore(location, connection).open("job")
    assert "If-None-Match" in str(raised.value)
    assert "If-None-Match and If-Match" in (raised.value.fix or "")
    # Nothing was claimed, and the probe object is gone.
    assert keys_under(s3, f"{location.prefix}/") == []


@pytest.mark.parametrize("nth", [1, 3, 4])
def test_a_probe_write_whose_answer_was_lost_is_no_verdict_on_the_server(
    location: S3Location, connection: S3Connection, s3: S3Endpoint, nth: int
) -> None:
    """The conditional-write probe's create (1st PUT) or its If-Match PUT on the object's own
    ETag (4th; the 3rd is refused by design) reaches the server and its answer is lost:
    botocore's retry is refused by the first attempt's effect. Read back, that is the server
    honouring the condition, not a server to refuse (before: ManifestError naming a
    PreconditionFailed, and ConfigError "refuses If-Match on the object's own ETag")."""
    with fail_request(
        connection.client(), "PutObject", ConnectionClosedError, nth=nth, sent=True
    ) as failed:
        store = opened(location, connection)
    assert failed.failed == 1
    assert store.generation == 1
    assert [k for k in keys_under(s3, f"{location.prefix}/") if "conditional-probe" in k] == []


def test_a_decision_lost_in_transit_is_in_doubt(
    location: S3Location, connection: S3Connection, hooks: Callable[..., None]
) -> None:
    store = opened(location, connection)
    assert store.get(2) is None

    def lose(request: AWSPreparedRequest, **_: Any) -> None:
        if request.method == "PUT" and request.url.endswith("decisions/000000000002.json"):
            raise ConnectionClosedError(endpoint_url=request.url)

    hooks("before-send.s3.PutObject", lose)
    with pytest.raises(InDoubtError, match="whether it is recorded is unknown") as raised:
        store.put(decision(2, store.generation))
    assert "nothing may be rolled back" in (raised.value.fix or "")


def test_a_decision_whose_answer_was_lost_is_recognised_as_ours(
    location: S3Location, connection: S3Connection, hooks: Callable[..., None]
) -> None:
    """The PUT reaches the server but its answer is lost; botocore retries it and the retry is
    refused (412: the record exists). put reads the slot again and finds its own record."""
    store = opened(location, connection)
    assert store.get(2) is None
    lost: list[str] = []

    def deliver_then_drop(request: AWSPreparedRequest, **_: Any) -> None:
        slot = request.method == "PUT" and request.url.endswith("decisions/000000000002.json")
        if slot and not lost:
            response = URLLib3Session().send(request)
            lost.append(str(response.status_code))
            raise ConnectionClosedError(endpoint_url=request.url)

    hooks("before-send.s3.PutObject", deliver_then_drop)
    made = decision(2, store.generation)
    assert store.put(made) == made
    assert lost == ["200"]
    assert opened(location, connection).get(2) == made


def test_a_failed_read_before_the_decision_is_not_in_doubt(
    location: S3Location, connection: S3Connection, hooks: Callable[..., None]
) -> None:
    """Nothing was sent yet: the coordinator may roll back."""
    store = opened(location, connection)

    def lose(request: AWSPreparedRequest, **_: Any) -> None:
        raise ConnectionClosedError(endpoint_url=request.url)

    hooks("before-send.s3.GetObject", lose)
    with pytest.raises(Exception) as raised:  # noqa: PT011 - the point is which class
        store.put(decision(2, store.generation))
    assert not isinstance(raised.value, InDoubtError | FencedError), raised.value


# -- choosing the store ---------------------------------------------------------------------------


def test_store_from_an_s3_uri_uses_boto3s_chain(
    s3: S3Endpoint, s3_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint_url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3.access_key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.secret_access_key)
    monkeypatch.setenv("AWS_REGION", s3.region)
    store = store_from(f"s3a://{s3.bucket}/{s3_prefix}store")
    assert isinstance(store, S3DecisionStore)
    assert store.open("job") == 1
    store.put(decision(0, 1))
    assert store.get(0) is not None


def test_an_s3_sink_hosts_the_default_store(s3: S3Endpoint, s3_prefix: str) -> None:
    config = {
        "path": f"s3://{s3.bucket}/{s3_prefix}events",
        "name": "lake",
        "endpoint_url": s3.endpoint_url,
        "region": s3.region,
        "access_key_id": s3.access_key_id,
        "secret_access_key": s3.secret_access_key,
        "addressing_style": "path",
        "connect_timeout_s": 5,
    }
    store = default_store_for("s3", config)
    assert isinstance(store, S3DecisionStore)
    assert str(store.location) == f"s3://{s3.bucket}/{s3_prefix}events/_decisions"
    assert store.open("job") == 1
    assert "s3 sink 'lake'" in store.where
    assert s3.secret_access_key not in repr(store) + store.where


# -- the conformance suite ------------------------------------------------------------------------


def test_file_sink_with_the_s3_decision_store(s3: S3Endpoint, s3_prefix: str) -> None:
    connection = connection_of(s3)

    def make() -> Scenario:
        folder = Path(tempfile.mkdtemp(prefix="ds-s3-store-conformance-"))
        location = S3Location(s3.bucket, f"{s3_prefix}{uuid.uuid4().hex[:10]}")
        return Scenario(
            job_id="conformance",
            targets=[FileTarget(folder / "files")],
            store=lambda: S3DecisionStore(location, connection),
            cleanup=lambda: shutil.rmtree(folder, ignore_errors=True),
        )

    stats = run_conformance(make, max_examples=CONFORMANCE_SAMPLE)
    check_exercised(stats)
