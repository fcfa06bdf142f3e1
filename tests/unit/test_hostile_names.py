"""Untrusted names (table, topic, bucket, prefix, job and sink names) never reach SQL, topic
names or object keys unchecked: hypothesis draws hostile ones (quotes, semicolons, path
separators, NUL and control characters, Unicode, very long) and each is refused with a
ConfigError or accepted only in a shape that cannot escape its place."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from durable_sinks.core.errors import ConfigError
from durable_sinks.core.naming import ParticipantName
from durable_sinks.sinks.folder import Files
from durable_sinks.sinks.kafka import Kafka
from durable_sinks.sinks.postgres import Postgres
from durable_sinks.sinks.s3 import S3

#: Names an attacker (or an unlucky column) would try.
KNOWN_BAD = [
    'x"; DROP TABLE canary; --',
    "x'; DROP TABLE canary; --",
    "a'b",
    'a"b',
    "a;b",
    "../x",
    "..",
    ".",
    "a/b",
    "a\\b",
    "a\x00b",
    "\x01",
    "a\nb",
    "é✓",
    "😀",
    " lead",
    "trail ",
    "a b",
    "x" * 64,
    "x" * 300,
    "",
    "a:b",
    "h-0123456789abcdef",
    "${env:HOME}",
    "%2e%2e",
]
HOSTILE = st.one_of(st.sampled_from(KNOWN_BAD), st.text(max_size=80), st.text(max_size=300))

PG_PART = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]{0,62}$")
KAFKA_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
S3_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
PARTICIPANT_PART = re.compile(r"^[A-Za-z0-9._-]{1,40}$")


def refused_or(check: bool, build: object) -> None:
    """`build` (a callable) raises a ConfigError, or returns with `check` true of the name."""
    assert callable(build)
    try:
        build()
    except ConfigError:
        return
    assert check, "a hostile name was accepted"


@settings(max_examples=300, deadline=None)
@given(name=HOSTILE)
def test_table_names_are_plain_identifiers_or_refused(name: str) -> None:
    for table in (name, f"public.{name}", f"{name}.events"):
        parts = table.split(".")
        refused_or(
            len(parts) <= 2 and all(PG_PART.match(p) for p in parts),
            lambda table=table: Postgres("host=db dbname=app", table),
        )


@settings(max_examples=300, deadline=None)
@given(name=HOSTILE)
def test_topic_names_are_kafka_legal_or_refused(name: str) -> None:
    legal = bool(KAFKA_TOPIC.match(name)) and name not in (".", "..")
    refused_or(legal, lambda: Kafka("broker:9092", name))
    refused_or(legal, lambda: Kafka("broker:9092", "events", progress_topic=name))


@settings(max_examples=300, deadline=None)
@given(name=HOSTILE)
def test_bucket_names_are_s3_legal_or_refused(name: str) -> None:
    """What reaches S3 as the bucket is a legal bucket name (a name with a `/` is read as
    a bucket and a prefix: `000/` is bucket `000`)."""
    try:
        config = S3(f"s3://{name}/events", endpoint_url="http://127.0.0.1:1")
    except ConfigError:
        return
    bucket = config.location.bucket
    assert S3_BUCKET.match(bucket), bucket
    assert ".." not in bucket, bucket
    assert name.split("/")[0] == bucket, (name, bucket)


@settings(max_examples=300, deadline=None)
@given(name=HOSTILE)
def test_prefixes_stay_under_their_bucket(name: str) -> None:
    """An accepted prefix has no empty, `.` or `..` segment and no control character: its
    keys cannot climb out of it on servers or tools that treat keys as paths."""
    try:
        config = S3(f"s3://bucket/{name}", endpoint_url="http://127.0.0.1:1")
    except ConfigError:
        return
    location = config.location
    assert location.bucket == "bucket"
    segments = location.prefix.strip("/").split("/")
    assert all(s not in ("", ".", "..") for s in segments), location.prefix
    assert not any(ord(c) < 32 for c in location.prefix), location.prefix


@settings(max_examples=300, deadline=None)
@given(job=HOSTILE, sink=HOSTILE)
def test_job_and_sink_names_in_participant_names_are_safe(job: str, sink: str) -> None:
    """Job and sink names reach Postgres gids, transactional ids, staging folders and object
    keys only through `component`: letters, digits, `.`, `_`, `-`, or a hash."""
    name = ParticipantName.build(job, sink, 3, "p0", 1, 0)
    fields = str(name).split(":")
    assert len(fields) == 6, str(name)
    assert PARTICIPANT_PART.match(fields[1])
    assert PARTICIPANT_PART.match(fields[2])
    assert ParticipantName.parse(str(name)) == name


@settings(max_examples=200, deadline=None)
@given(name=HOSTILE)
def test_sink_names_that_could_name_a_folder_are_plain_or_refused(name: str) -> None:
    plain = name not in ("", ".", "..") and not re.search(r"[/\\\x00-\x1f\x7f]", name)
    refused_or(plain, lambda: Files("/data/out", name=name))
    refused_or(plain, lambda: S3("s3://bucket/p", name=name))
