"""Decision store in S3 (or an S3-compatible server that honours conditional writes).

Layout under `<prefix>/<job>/` (`<job>` as in participant names)::

    generation.json          {"format": "durable-sinks/generation", "generation": g, ...}
    decisions/<epoch>.json   the epoch's slot: its decision record, or a claim
                             {"format": "durable-sinks/claim", "generation": h}
    finished/<epoch>         every participant of the epoch is committed
    latest, expired-below    hints (stale or lost: corrected by a bounded listing)

S3 makes single objects conditional (`If-None-Match: *`: create only; `If-Match: <ETag>`:
replace only the version read), never two at once, so generations fence per epoch *slot*:

- `open` claims generation g+1 by a compare-and-swap of `generation.json` on its ETag.
- `get(e)` by generation G leaves the slot either holding a decision (returned) or a claim of
  G: it creates the claim if the slot is empty and replaces a claim of an older generation
  (If-Match on its ETag). A claim of a newer generation is FencedError.
- `put(record)` first reads `generation.json` (a newer generation: FencedError), then writes
  the record into the slot if it is empty (If-None-Match) or holds a claim of G or older
  (If-Match on that claim's ETag). That PUT is the commit point. A slot already holding a
  decision is returned instead (first wins); a claim of a newer generation is FencedError.

Every write of a slot is conditional on the version read and a claim's generation only grows,
so once generation g has looked an epoch up (get or put) no older generation can add a record
for it: its PUT either finds g's claim (FencedError) or a stale ETag (412, read again). An
older generation's put that read `generation.json` before g claimed it may still land, for an
epoch g has not looked up yet; g then finds that decision and finishes it (DecisionStore's
docstring states the guarantee every store gives). A decision is never replaced.

Lookups are O(1): `get` and `put` touch one slot; `latest_epoch` lists only the slots from the
highest decided epoch it knows (from memory, else the `latest` hint) upwards, telling claims
(under 128 bytes) from records by size; `expire` lists from the `expired-below` watermark.
Hints are rewritten every 100 epochs (best effort): a stale one costs one listing page.

Faults: no botocore error leaves a call. An unreachable server is UnreachableError, a dropped
request or a server error TransientError, refused credentials, permissions or a missing bucket
a ConfigError with the fix; in `put`, any failure after the record's PUT was sent (a lost
answer, a 5xx) is InDoubtError: the decision may be recorded. A damaged object is
ManifestCorruptError naming its key. Secrets never appear in an error or a repr. The requests
themselves, and the translation of their failures, are `_s3_folder.S3Folder`'s.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from botocore.exceptions import ClientError

from durable_sinks.clients.s3 import S3Connection, S3Location
from durable_sinks.core.errors import (
    DurableSinkError,
    FencedError,
    InDoubtError,
    ManifestCorruptError,
    ManifestError,
    TransientError,
    UsageError,
)
from durable_sinks.core.formats import stored_format
from durable_sinks.core.naming import component
from durable_sinks.core.operations import Bookkeeping

from ._record import DecisionRecord
from ._s3_folder import REQUEST_ERRORS, WIDTH, S3Folder
from ._store import logs_expire, logs_open, logs_put, require_open, require_own

GENERATION_FORMAT = "durable-sinks/generation"
CLAIM_FORMAT = "durable-sinks/claim"
S3_STORE = stored_format(
    "S3 decision store layout",
    current=1,
    oldest=1,
    where="the job's folder: `generation.json` and each slot's claim carry `\"version\"` "
    "(its decision records their own)",
)
#: A claim is about 60 bytes, a decision record never under 200 (its envelope alone carries a
#: 64-digit SHA-256): listings tell them apart by size.
CLAIM_MAX_BYTES = 128
#: Claims this store remembers the ETag of (saves a read in `put`); older ones are re-read.
_REMEMBERED_CLAIMS = 1024
#: Conditional writes lost to other writers before a call gives up (each loss is another
#: writer's progress; a slot changes at most a few times).
_ROUNDS = 64


@dataclass(frozen=True)
class _Slot:
    """What an epoch's slot holds: nothing (etag None), a claim, or a decision."""

    etag: str | None
    claim: int | None = None
    record: DecisionRecord | None = None


@dataclass(frozen=True)
class _Generation:
    generation: int
    claimant: str
    etag: str


def _json(value: Mapping[str, object]) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def _slot_name(epoch: int) -> str:
    return f"{epoch:0{WIDTH}d}.json"


class S3DecisionStore:
    """A durable DecisionStore in S3, under `location` (`s3://bucket/prefix`; the bucket must
    exist). One instance serves one job, from `open` on; `location` may hold many jobs.

    `connection` says how to reach the server (default: boto3's chain: AWS_ENDPOINT_URL,
    AWS_ACCESS_KEY_ID, ~/.aws, a role). The server must honour `If-None-Match: *` and
    `If-Match` on PUT: `open` checks it and refuses (ConfigError) otherwise. Needs
    s3:GetObject, s3:PutObject, s3:DeleteObject and s3:ListBucket on the prefix.
    """

    def __init__(
        self,
        location: str | S3Location,
        connection: S3Connection | None = None,
        *,
        where: str | None = None,
    ) -> None:
        self.location = (
            location
            if isinstance(location, S3Location)
            else S3Location.parse(location, what="decision_store")
        )
        self.connection = connection if connection is not None else S3Connection()
        #: Whose store this is, for messages (the user named it, or a sink hosts it).
        self.where = where or "the job's decision store"
        self._job: str | None = None
        self._folder = self._folder_of(None)
        self._generation = -1
        self._claims: dict[int, str] = {}  # epoch -> ETag of this generation's claim
        self._latest: int | None = None  # the highest decided epoch known
        self._latest_hint: int | None = None  # what the `latest` hint holds, as far as known
        self._expired_below: int | None = None
        self._expired_hint: int | None = None

    @property
    def durable(self) -> bool:
        return True

    @property
    def generation(self) -> int:
        return self._generation

    def __repr__(self) -> str:
        return f"S3DecisionStore({str(self.location)!r}, job={self._job!r})"

    def _folder_of(self, job: str | None) -> S3Folder:
        home = self.location.key(component(job)) if job is not None else self.location.prefix
        return S3Folder(self.location, self.connection, home, where=self.where, job=job)

    # -- generations ---------------------------------------------------------------------------
    @logs_open
    def open(self, job_id: str) -> int:
        if self._job is not None:
            raise UsageError(f"{self!r} is already open", job=job_id)
        self._job = job_id
        self._folder = self._folder_of(job_id)
        try:
            self._folder.check_server()
            self._generation = self._claim_generation()
        except BaseException:
            self._job = None
            raise
        return self._generation

    def _read_generation(self, folder: S3Folder) -> _Generation | None:
        key = folder.key("generation.json")
        try:
            found = folder.read(key)
        except REQUEST_ERRORS as exc:
            raise folder.failure(exc, f"read {folder.uri(key)}") from None
        if found is None:
            return None
        data, etag = found
        try:
            value = json.loads(data)
            if value.get("format") != GENERATION_FORMAT:
                raise ValueError("format")  # noqa: TRY301 - one message for every damage
            S3_STORE.check(value.get("version"), source=folder.uri(key), job=folder.job)
            return _Generation(int(value["generation"]), str(value.get("claimant", "")), etag)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ManifestCorruptError(
                f"{folder.uri(key)}: not a durable-sinks generation object ({len(data)} bytes)",
                job=folder.job,
                fix="it was changed outside durable-sinks; restore it from a backup, or write "
                '{"format": "durable-sinks/generation", "generation": N} with N above every '
                "generation the job used",
            ) from exc

    def _claim_generation(self) -> int:
        key = self._folder.key("generation.json")
        claimant = uuid.uuid4().hex
        for attempt in range(_ROUNDS):
            current = self._read_generation(self._folder)
            if current is not None and current.claimant == claimant:
                # Our PUT landed but its answer was lost (a 412 on botocore's retry).
                return current.generation
            number = 1 if current is None else current.generation + 1
            body = _json(
                {
                    "format": GENERATION_FORMAT,
                    "version": S3_STORE.current,
                    "generation": number,
                    "claimant": claimant,
                }
            )
            try:
                written = self._folder.write(
                    key, body, replacing=None if current is None else current.etag
                )
            except REQUEST_ERRORS as exc:
                raise self._folder.failure(
                    exc, f"claim generation {number} in {self._folder.uri(key)}"
                ) from None
            if written is not None:
                return number
            time.sleep(random.uniform(0, 0.002 * (attempt + 1)))  # noqa: S311 - back-off jitter
        raise TransientError(
            f"{self.where}: could not claim a generation in {self._folder.uri(key)}: other "
            f"coordinators of the job claimed {_ROUNDS} in a row",
            job=self._job,
            fix="start one driver per job_id; a retry may succeed",
        )

    def peek_generation(self, job_id: str) -> int:
        current = self._read_generation(self._folder_of(job_id))
        return 0 if current is None else current.generation

    def _require_open(self) -> str:
        return require_open(self._job)

    def _fenced(self, epoch: int, newer: int, what: str) -> FencedError:
        return FencedError(
            f"{self.where}: generation {newer} of the job took over (this coordinator is "
            f"generation {self._generation}); {what}",
            job=self._job,
            epoch=epoch,
        )

    # -- slots ---------------------------------------------------------------------------------
    def _slot(self, epoch: int, data: bytes, etag: str) -> _Slot:
        key = self._folder.key("decisions", _slot_name(epoch))
        if len(data) <= CLAIM_MAX_BYTES:
            claim = self._claim_in(key, data)
            if claim is not None:
                return _Slot(etag, claim=claim)
        record = DecisionRecord.from_bytes(data, source=self._folder.uri(key))
        if record.epoch != epoch or record.job_id != self._job:
            raise ManifestCorruptError(
                f"{self._folder.uri(key)} holds the decision of job {record.job_id!r} epoch "
                f"{record.epoch}, not of job {self._job!r} epoch {epoch}",
                job=self._job,
                epoch=epoch,
                fix="the store was changed outside durable-sinks (a copied or renamed object); "
                "restore the job's folder from a backup",
            )
        return _Slot(etag, record=record)

    def _claim_in(self, key: str, data: bytes) -> int | None:
        """The generation of the claim `data` holds, None if it is not a claim."""
        try:
            value = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError):
            return None  # from_bytes names the damage
        if not isinstance(value, dict) or value.get("format") != CLAIM_FORMAT:
            return None
        S3_STORE.check(value.get("version"), source=self._folder.uri(key), job=self._job)
        generation = value.get("generation")
        if not isinstance(generation, int) or generation < 0:
            raise ManifestCorruptError(
                f"{self._folder.uri(key)}: a claim without a valid generation ({generation!r})",
                job=self._job,
                fix="it was changed outside durable-sinks; delete it only after checking no "
                "coordinator of the job runs",
            )
        return generation

    def _read_slot(self, epoch: int, *, in_doubt: bool = False) -> _Slot:
        """The slot as it is now. A failed read is InDoubtError with `in_doubt` (a put whose
        record may already be there), else the request's typed error."""
        key = self._folder.key("decisions", _slot_name(epoch))
        try:
            found = self._folder.read(key)
        except REQUEST_ERRORS as exc:
            if in_doubt:
                raise self._in_doubt(exc, epoch) from None
            raise self._folder.failure(exc, f"read {self._folder.uri(key)}", epoch) from None
        if found is None:
            return _Slot(None)
        return self._slot(epoch, *found)

    def _remember_claim(self, epoch: int, etag: str) -> None:
        self._claims.pop(epoch, None)
        self._claims[epoch] = etag
        while len(self._claims) > _REMEMBERED_CLAIMS:
            del self._claims[next(iter(self._claims))]

    def get(self, epoch: int) -> DecisionRecord | None:
        """The epoch's decision; with none, the slot is left claimed by this generation, so
        no older one can decide the epoch any more (FencedError if a newer one claimed it)."""
        self._require_open()
        key = self._folder.key("decisions", _slot_name(epoch))
        claim = _json(
            {"format": CLAIM_FORMAT, "version": S3_STORE.current, "generation": self._generation}
        )
        for _ in range(_ROUNDS):
            slot = self._read_slot(epoch)
            if slot.record is not None:
                self._saw_decision(epoch)
                return slot.record
            if slot.claim is not None and slot.claim > self._generation:
                raise self._fenced(epoch, slot.claim, "it owns this epoch now")
            if slot.claim == self._generation and slot.etag is not None:
                self._remember_claim(epoch, slot.etag)
                return None
            try:
                written = self._folder.write(key, claim, replacing=slot.etag)
            except REQUEST_ERRORS as exc:
                raise self._folder.failure(exc, f"claim {self._folder.uri(key)}", epoch) from None
            if written is not None:
                self._remember_claim(epoch, written)
                return None
        raise TransientError(
            f"{self.where}: {self._folder.uri(key)} kept changing while it was read", job=self._job
        )

    def peek(self, job_id: str, epoch: int) -> DecisionRecord | None:
        folder = self._folder_of(job_id)
        key = folder.key("decisions", _slot_name(epoch))
        try:
            found = folder.read(key)
        except REQUEST_ERRORS as exc:
            raise folder.failure(exc, f"read {folder.uri(key)}", epoch) from None
        if found is None or len(found[0]) <= CLAIM_MAX_BYTES:
            return None  # no slot, or a claim: undecided
        return DecisionRecord.from_bytes(found[0], source=folder.uri(key))

    def peek_latest(self, job_id: str) -> int | None:
        highest = None
        for epoch, size in self._folder_of(job_id).listed("decisions", None):
            if size > CLAIM_MAX_BYTES:
                highest = epoch
        return highest

    @logs_put
    def put(self, record: DecisionRecord) -> DecisionRecord:
        job = self._require_open()
        require_own(record, job, self._generation)
        epoch = record.epoch
        key = self._folder.key("decisions", _slot_name(epoch))
        current = self._read_generation(self._folder)
        if current is None or current.generation < self._generation:
            raise ManifestError(
                f"{self.where}: {self._folder.uri(self._folder.key('generation.json'))} is "
                f"missing or went back below generation {self._generation} while this "
                "coordinator ran; no decision was recorded",
                job=job,
                epoch=epoch,
                fix="the job's folder in the store was removed or restored from an old backup; "
                "restore it, or stop every driver of the job before resetting its store",
            )
        if current.generation > self._generation:
            raise self._fenced(epoch, current.generation, "this decision was not recorded")
        etag = self._claims.pop(epoch, None)
        # Our own claim, as get left it (a 412 on the PUT means it changed: read again).
        slot: _Slot | None = None if etag is None else _Slot(etag, claim=self._generation)
        body = record.to_bytes()
        sent = False
        for _ in range(_ROUNDS):
            if slot is None:
                slot = self._read_slot(epoch, in_doubt=sent)
            if slot.record is not None:
                self._saw_decision(epoch)
                return slot.record  # first wins (ours, if an answer was lost and retried)
            if slot.claim is not None and slot.claim > self._generation:
                raise self._fenced(epoch, slot.claim, "this decision was not recorded")
            try:
                sent = True
                written = self._folder.write(key, body, replacing=slot.etag)
            except REQUEST_ERRORS as exc:
                raise self._put_failure(exc, epoch, key) from None
            if written is not None:
                self._saw_decision(epoch, hint=True)
                return record
            slot = None
        raise InDoubtError(
            f"{self.where}: {self._folder.uri(key)} kept changing while the decision was written",
            job=job,
            epoch=epoch,
        )

    def _put_failure(self, exc: Exception, epoch: int, key: str) -> DurableSinkError:
        """A refusal (4xx: credentials, permissions) recorded nothing: its typed error. Anything
        else (no answer, a 5xx) may have recorded the decision: InDoubtError."""
        if isinstance(exc, ClientError):
            status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
            if 400 <= status < 500 and status not in (408, 429):
                return self._folder.failure(
                    exc, f"write the decision {self._folder.uri(key)}", epoch
                )
        return self._in_doubt(exc, epoch)

    def _in_doubt(self, exc: Exception, epoch: int) -> InDoubtError:
        cause = self._folder.failure(exc, f"write the decision of epoch {epoch}", epoch)
        return InDoubtError(
            f"{cause.message}; the decision was sent, so whether it is recorded is unknown",
            job=self._job,
            epoch=epoch,
            fix="nothing may be rolled back: replaying the epoch or restarting the job (a new "
            "coordinator) reads the decision once S3 answers and finishes the epoch, or writes "
            "it again if none was recorded",
        )

    # -- finished epochs and hints -------------------------------------------------------------
    def mark_finished(self, epoch: int) -> None:
        self._require_open()
        self._folder.mark(self._folder.key("finished", f"{epoch:0{WIDTH}d}"), epoch)

    def is_finished(self, epoch: int) -> bool:
        self._require_open()
        return self._folder.exists(self._folder.key("finished", f"{epoch:0{WIDTH}d}"), epoch)

    def _saw_decision(self, epoch: int, *, hint: bool = False) -> None:
        """Remember that `epoch` is decided; with `hint`, rewrite the `latest` hint when it is
        HINT_EVERY epochs behind (or unknown)."""
        if self._latest is None or epoch > self._latest:
            self._latest = epoch
        if hint:
            self._latest_hint = self._folder.refresh_hint("latest", epoch, self._latest_hint)

    def latest_epoch(self) -> int | None:
        """The highest decided epoch: the slots from the highest one known (this store's
        memory, else the `latest` hint) upwards, in one listing request in the steady state.
        Only a hint that is missing or points at a vanished record makes it list every slot
        (and rewrite the hint)."""
        self._require_open()
        start = self._latest
        if start is None:
            start = self._latest_hint = self._folder.read_hint("latest")
        found = self._highest_decided(start)
        if found is None and start is not None:
            found = self._highest_decided(None)  # the hint's record is gone: scan once
        if found is None:
            return None
        self._latest = found
        self._latest_hint = self._folder.refresh_hint("latest", found, self._latest_hint)
        return found

    def _highest_decided(self, start: int | None) -> int | None:
        highest = None
        for epoch, size in self._folder.listed("decisions", start):
            if size > CLAIM_MAX_BYTES:
                highest = epoch
        return highest

    @logs_expire
    def expire(self, before_epoch: int) -> int:
        """Delete finished records of epochs below `before_epoch`, oldest first, stopping at
        the first unfinished one (claims of undecided epochs stay: they fence). Amortised
        O(1) per epoch: two listings from the `expired-below` watermark, one batch delete."""
        self._require_open()
        start = self._expired_below
        if start is None:
            start = self._expired_hint = self._folder.read_hint("expired-below")
        if start is None:  # the first expiry in this folder: start at the oldest slot, once
            oldest = [next(self._folder.listed(f, None), None) for f in ("decisions", "finished")]
            start = min((o[0] for o in oldest if o is not None), default=max(before_epoch, 0))
        if start >= before_epoch:
            self._expired_below = start
            return 0
        finished: set[int] = set()
        for epoch, _ in self._folder.listed("finished", start):
            if epoch >= before_epoch:
                break
            finished.add(epoch)
        doomed: list[str] = []
        stop = before_epoch
        for epoch, size in self._folder.listed("decisions", start):
            if epoch >= before_epoch:
                break
            if size <= CLAIM_MAX_BYTES:
                continue  # a claim: the epoch was looked up but never decided
            if epoch not in finished:
                stop = epoch
                break
            doomed.append(self._folder.key("decisions", _slot_name(epoch)))
        removed = len(doomed)
        doomed += [
            self._folder.key("finished", f"{e:0{WIDTH}d}") for e in sorted(finished) if e < stop
        ]
        self._folder.delete(doomed)
        self._expired_below = stop
        self._expired_hint = self._folder.refresh_hint("expired-below", stop, self._expired_hint)
        return removed

    def drop_job(self, job_id: str, *, apply: bool) -> list[Bookkeeping]:
        """Every object under the job's folder `<prefix>/<job>/` (generation, decisions,
        finished marks, hints): counted, and with `apply` deleted. Each key is checked to lie
        in that folder before it is deleted."""
        folder = self._folder_of(job_id)
        return folder.drop(apply=apply)

    def close(self) -> None:
        """Forget what this store remembers; the client is shared and stays (never raises)."""
        self._claims.clear()
