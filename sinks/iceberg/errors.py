"""What the Iceberg sink's clients' failures mean (pyiceberg, its REST and SQL catalogs, the
FileIO's storage): each as the typed error that says whether time or settings cure it, with
the catalog's secrets masked in its text."""

from __future__ import annotations

from durable_sinks.core.errors import (
    ConfigError,
    DurableSinkError,
    InDoubtError,
    TransientError,
    UnreachableError,
)
from durable_sinks.core.sink_base import SinkBase, Step

from .config import Iceberg, redacted


class CommitConflictError(TransientError):
    """An epoch's Iceberg commit kept losing races with other writers of the table."""


def translate(exc: Exception, step: Step, sink: SinkBase[Iceberg]) -> DurableSinkError | None:
    """The typed error for `exc`, raised by a client during `step`, naming the sink's job,
    name and epoch and the fix; None when `exc` is none of the clients' (it is re-raised as it
    is). A failure of the commit itself whose outcome is unknown is an InDoubtError."""
    from pyiceberg.exceptions import (
        CommitFailedException,
        CommitStateUnknownException,
        ForbiddenError,
        NoSuchNamespaceError,
        NoSuchTableError,
        OAuthError,
        RESTError,
        ServerError,
        UnauthorizedError,
    )

    config, where = sink.config, sink.where(step.epoch)
    text = f"could not {step.action} ({config.where}): {type(exc).__name__}: {exc}"
    text = hide_secrets(text, config)
    if isinstance(exc, (NoSuchNamespaceError, NoSuchTableError)):
        return ConfigError(text, **where, fix="check the catalog, namespace and table")
    foreign = isinstance(exc, RESTError) and _NOT_REST in str(exc)  # not a catalog's answer
    if isinstance(exc, (OAuthError, UnauthorizedError, ForbiddenError)) and not foreign:
        return ConfigError(text, **where, fix="check the catalog's credentials")
    if isinstance(exc, CommitFailedException):
        return CommitConflictError(text, **where, fix="another writer committed meanwhile")
    if step.in_doubt is not None or isinstance(exc, CommitStateUnknownException):
        return InDoubtError(text, **where, fix=step.in_doubt)
    if foreign or (
        isinstance(exc, RESTError)
        and not isinstance(exc, ServerError)
        and step.action == "load the catalog"
    ):
        return ConfigError(
            text,
            **where,
            fix="the uri does not answer as an Iceberg REST catalog: give the catalog's "
            "base URL (e.g. http://host:8181, SeaweedFS's -s3.port.iceberg), not the S3 "
            "gateway's or another server's",
        )
    if isinstance(exc, ServerError):
        return TransientError(text, **where, fix="the catalog's server failed; it is retried")
    kind = failure_kind(exc)
    if kind == "config":
        return ConfigError(
            text, **where, fix="check the catalog's properties (its uri and warehouse)"
        )
    if kind == "storage-config":
        return ConfigError(
            text,
            **where,
            fix="the table's storage refused these settings: check the catalog's FileIO "
            "properties (s3.endpoint, s3.access-key-id, s3.secret-access-key, s3.region) "
            "and that the keys may read and write the table's location",
        )
    if kind == "storage-unreachable":
        return UnreachableError(
            text, **where, fix="check that the table's storage (s3.endpoint) answers"
        )
    if kind == "unreachable":
        return UnreachableError(text, **where, fix="check that the catalog's server answers")
    if isinstance(exc, OSError):
        return TransientError(text, **where, fix="check the table's storage")
    return None


#: pyiceberg's words for an answer that is not an Iceberg REST catalog's JSON.
_NOT_REST = "unexpected JSON Payload"
#: pyarrow's S3 errors that settings, not time, will cure (its `AWS Error <CODE>` texts).
_S3_REFUSALS = (
    "ACCESS_DENIED",
    "SIGNATURE_DOES_NOT_MATCH",
    "INVALID_ACCESS_KEY_ID",
    "NO_SUCH_BUCKET",
    "UNRECOGNIZED_CLIENT",
)


def failure_kind(exc: Exception) -> str | None:
    """ "config" for a catalog URI or driver that cannot work, "unreachable" for a server
    that does not answer, "storage-config" for S3 that refuses the FileIO's settings,
    "storage-unreachable" for S3 that does not answer, else None."""
    module = type(exc).__module__
    name = type(exc).__name__
    if module.startswith("sqlalchemy"):
        if name in ("ArgumentError", "NoSuchModuleError"):
            return "config"
        if name in ("OperationalError", "InterfaceError", "TimeoutError"):
            text = str(exc).lower()
            if "password" in text or "does not exist" in text or "authentication" in text:
                return "config"
            return "unreachable"
    if module.startswith(("requests", "urllib3")) and "Connection" in name:
        return "unreachable"
    if isinstance(exc, OSError) and "AWS Error" in str(exc):  # pyarrow's S3 filesystem
        text = str(exc)
        if any(code in text for code in _S3_REFUSALS):
            return "storage-config"
        if "NETWORK_CONNECTION" in text:
            return "storage-unreachable"
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return "unreachable"
    return None


def hide_secrets(text: str, config: Iceberg) -> str:
    for key, value in config.catalog_properties().items():
        if isinstance(value, str) and value and key.lower() not in ("type", "warehouse"):
            shown = redacted({key: value})[key]
            if shown != value:
                text = text.replace(value, shown)
    return text
