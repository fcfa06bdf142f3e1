"""SCRAM users and ACLs on the test bed's SASL_SSL listener, so a test sees the broker's own
refusals (authentication, topic, transactional id, group authorization failures).

The users are made through the admin API on the PLAINTEXT listener, whose principal
(ANONYMOUS) is the broker's super user; on the SASL_SSL listener each user may do only what
its ACLs allow (tests/services/kafka.py).

    user = kafka_access.user()                                  # no ACL at all
    kafka_access.allow(user, *job_acls(user.name, job, topic))   # the documented least set
    endpoint = kafka_access.endpoint(user)                       # SASL_SSL, verify the CA
"""

from __future__ import annotations

import contextlib
import secrets
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)

from durable_sinks.core.naming import component
from durable_sinks.sinks.kafka.config import PROGRESS_READER_GROUP
from tests.services import KafkaEndpoint, Testbed

#: The broker applies a new SCRAM credential or ACL within this many seconds (measured: ~0.1).
PROPAGATION_TIMEOUT = 15.0


@dataclass(frozen=True)
class ScramUser:
    name: str
    password: str = field(repr=False)


def acl(
    user: str,
    resource: ResourceType,
    name: str,
    operation: AclOperation,
    *,
    prefixed: bool = False,
) -> AclBinding:
    """An ALLOW of `operation` on a resource for `User:<user>` from any host."""
    pattern = ResourcePatternType.PREFIXED if prefixed else ResourcePatternType.LITERAL
    return AclBinding(
        resource, name, pattern, f"User:{user}", "*", operation, AclPermissionType.ALLOW
    )


def job_acls(
    user: str, job_id: str, topic: str, progress_topic: str | None = None
) -> dict[str, list[AclBinding]]:
    """The least a job writing `topic` needs (docs/security.md), by purpose, so a test can
    leave one purpose out: the topic (write, describe, describe configs), the progress topic
    (read, write, describe, describe configs; created beforehand here), the transactional ids
    (`ds:<job>:` prefix: write, describe)."""
    progress = progress_topic or f"{topic}-ds-progress"
    ids = f"ds:{component(job_id)}:"  # a long or odd job id is hashed (core/naming.py)
    return {
        "topic write": [acl(user, ResourceType.TOPIC, topic, AclOperation.WRITE)],
        "topic": [
            acl(user, ResourceType.TOPIC, topic, AclOperation.DESCRIBE),
            acl(user, ResourceType.TOPIC, topic, AclOperation.DESCRIBE_CONFIGS),
        ],
        "progress topic": [
            acl(user, ResourceType.TOPIC, progress, AclOperation.READ),
            acl(user, ResourceType.TOPIC, progress, AclOperation.WRITE),
            acl(user, ResourceType.TOPIC, progress, AclOperation.DESCRIBE),
            acl(user, ResourceType.TOPIC, progress, AclOperation.DESCRIBE_CONFIGS),
        ],
        "progress reader group": [
            acl(user, ResourceType.GROUP, PROGRESS_READER_GROUP, AclOperation.DESCRIBE),
        ],
        "transactional id": [
            acl(
                user,
                ResourceType.TRANSACTIONAL_ID,
                ids,
                AclOperation.WRITE,
                prefixed=True,
            ),
            acl(
                user,
                ResourceType.TRANSACTIONAL_ID,
                ids,
                AclOperation.DESCRIBE,
                prefixed=True,
            ),
        ],
    }


def operator_acls(user: str, topic: str) -> list[AclBinding]:
    """What the `durable-sinks` command needs beyond the job's ACLs: `status` and `verify`
    count the topic's records per epoch (docs/security.md)."""
    return [acl(user, ResourceType.TOPIC, topic, AclOperation.READ)]


class KafkaAccess:
    """Makes SCRAM users and ACLs for one test; `close` deletes both."""

    def __init__(self, testbed: Testbed) -> None:
        self.testbed = testbed
        self.admin = AdminClient(testbed.kafka.endpoint().config())
        self.users: list[ScramUser] = []

    def user(self) -> ScramUser:
        """A new SCRAM-SHA-512 user with a random password and no ACL."""
        made = ScramUser(f"ds-user-{uuid.uuid4().hex[:10]}", secrets.token_urlsafe(18))
        upsert = UserScramCredentialUpsertion(
            made.name,
            ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096),
            made.password.encode(),
        )
        for future in self.admin.alter_user_scram_credentials([upsert]).values():
            future.result(timeout=30)
        self.users.append(made)
        return made

    def revoke(self, user: ScramUser) -> None:
        """Delete the user's credential: its password stops working (a revoked credential)."""
        deletion = UserScramCredentialDeletion(user.name, ScramMechanism.SCRAM_SHA_512)
        for future in self.admin.alter_user_scram_credentials([deletion]).values():
            future.result(timeout=30)

    def allow(self, *groups: Iterable[AclBinding]) -> None:
        bindings = [binding for group in groups for binding in group]
        for future in self.admin.create_acls(bindings, request_timeout=30).values():
            future.result(timeout=30)

    def endpoint(self, user: ScramUser, *, host: str | None = None) -> KafkaEndpoint:
        kafka = self.testbed.kafka
        if host is None:
            return kafka.secure_endpoint(user.name, user.password)
        return kafka.secure_endpoint(user.name, user.password, host=host)

    def close(self) -> None:
        for user in self.users:
            everything = AclBindingFilter(
                ResourceType.ANY,
                None,  # type: ignore[arg-type]  # None matches any name (librdkafka)
                ResourcePatternType.ANY,
                f"User:{user.name}",
                None,  # type: ignore[arg-type]  # any host
                AclOperation.ANY,
                AclPermissionType.ANY,
            )
            for future in self.admin.delete_acls([everything], request_timeout=30).values():
                future.result(timeout=30)
            with contextlib.suppress(KafkaException):  # revoked by the test already
                self.revoke(user)
        self.users.clear()
