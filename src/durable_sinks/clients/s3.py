"""Connections to S3 (or an S3-compatible server), shared by the S3 sink and the S3 decision
store: where a dataset lives (`S3Location`, from an `s3://bucket/prefix` URI), how to reach the
server (`S3Connection`, picklable, secrets kept out of its repr), what a failed request means
(`s3_failure`: retriable or a setting to fix, never a raw botocore error), and the probes a
job runs at start (conditional writes).

boto3 is imported only when a client is built or an error is translated, so importing this
module loads no client library. Clients are cached per process and settings (a boto3 client
costs ~50 ms to build; executor tasks build sinks for every part).
"""

from __future__ import annotations

import binascii
import hashlib
import os
import re
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from durable_sinks.core.errors import (
    ConfigError,
    DurableSinkError,
    TransientError,
    UnreachableError,
)
from durable_sinks.core.secrets import check, resolve

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

#: URI schemes that name an S3 location (`s3a://` is Hadoop's spelling, common in Spark jobs).
SCHEMES = ("s3", "s3a")
_URI = re.compile(r"^(?P<scheme>[A-Za-z0-9+.-]+)://(?P<bucket>[^/]*)(?:/(?P<prefix>.*))?$")
#: S3's bucket naming rules (lower case letters, digits, dots and hyphens, 3 to 63 long).
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
#: S3's own limits.
MIN_PART_SIZE = 5 * 1024 * 1024
MAX_PART_SIZE = 5 * 1024 * 1024 * 1024
MAX_PARTS = 10_000
MAX_OBJECT_SIZE = 5 * 1024**4
MAX_KEY_BYTES = 1024
#: Attempts per request by default (botocore's standard retry mode's own default is 3).
DEFAULT_REQUEST_ATTEMPTS = 4

AddressingStyle = Literal["auto", "path", "virtual"]


@dataclass(frozen=True)
class S3Location:
    """A bucket and a key prefix (no leading or trailing slash; empty: the bucket's root)."""

    bucket: str
    prefix: str = ""

    @classmethod
    def parse(cls, uri: str, *, what: str = "path") -> S3Location:
        """`s3://bucket/some/prefix` (or `s3a://`) as a location; ConfigError naming `what`
        (the setting) for anything else."""
        match = _URI.match(uri.strip()) if isinstance(uri, str) else None
        if match is None or match.group("scheme").lower() not in SCHEMES:
            raise ConfigError(
                f"{what} {uri!r} is not an s3://bucket/prefix URI",
                fix=f"write {what}='s3://my-bucket/datasets/events'",
            )
        bucket = match.group("bucket")
        if not _BUCKET.match(bucket) or ".." in bucket:
            raise ConfigError(
                f"{what} {uri!r}: {bucket!r} is not a valid bucket name",
                fix="S3 bucket names are 3 to 63 lower-case letters, digits, dots and hyphens",
            )
        prefix = (match.group("prefix") or "").strip("/")
        if any(ord(c) < 32 or ord(c) == 127 for c in prefix):
            raise ConfigError(
                f"{what} {uri!r}: the prefix has control characters",
                fix="write the prefix as plain folder names (letters, digits, '-', '_', '.')",
            )
        if "//" in prefix or any(p in (".", "..") for p in prefix.split("/")):
            raise ConfigError(
                f"{what} {uri!r}: the prefix has an empty, '.' or '..' segment",
                fix="write the prefix as plain folder names separated by single slashes",
            )
        if len(prefix.encode()) > MAX_KEY_BYTES // 2:
            raise ConfigError(
                f"{what} {uri!r}: the prefix is {len(prefix.encode())} bytes long",
                fix=f"keep the prefix under {MAX_KEY_BYTES // 2} bytes (S3 keys hold at most "
                f"{MAX_KEY_BYTES})",
            )
        return cls(bucket, prefix)

    def key(self, *parts: str) -> str:
        """The key of `parts` under the prefix (`prefix/a/b`)."""
        return "/".join(p for p in (self.prefix, *parts) if p)

    def child(self, *parts: str) -> S3Location:
        return S3Location(self.bucket, self.key(*parts))

    @property
    def folder(self) -> str:
        """The prefix as a listing prefix (`prefix/`, or '' for the bucket's root)."""
        return f"{self.prefix}/" if self.prefix else ""

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"


@dataclass(frozen=True)
class S3Connection:
    """How to reach the server (picklable: built where the sink or store runs).

    Unset credentials and region come from boto3's default chain (AWS_ACCESS_KEY_ID /
    AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, AWS_REGION, ~/.aws, an instance or pod role),
    an unset endpoint_url from AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL or else AWS itself.
    """

    endpoint_url: str | None = None
    region: str | None = None
    access_key_id: str | None = field(default=None, repr=False)
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    addressing_style: AddressingStyle = "auto"
    #: Seconds a connection attempt may take.
    connect_timeout_s: float = 10.0
    #: Seconds a request may wait for the server's answer (each attempt; the longest silence
    #: between two reads of the answer).
    request_timeout_s: float = 60.0
    #: Attempts per request, the first included: throttling, 5xx answers, dropped connections
    #: and time-outs are retried by the client. A request on a server that stops answering
    #: fails after about `request_attempts` x `request_timeout_s` (docs/s3.md, "Bounded
    #: waits").
    request_attempts: int = DEFAULT_REQUEST_ATTEMPTS
    #: A PEM file of the CAs that verify an https endpoint (None: boto3's default, i.e.
    #: AWS_CA_BUNDLE or the system's CAs).
    ca_bundle: str | None = None

    def __post_init__(self) -> None:
        if (self.access_key_id is None) != (self.secret_access_key is None):
            raise ConfigError(
                "S3: access_key_id and secret_access_key must be given together",
                fix="give both, or neither (boto3's default chain: environment, ~/.aws, a role)",
            )
        if self.addressing_style not in ("auto", "path", "virtual"):
            raise ConfigError(
                f"S3: addressing_style {self.addressing_style!r} is not auto, path or virtual",
                fix="addressing_style='path' for most S3-compatible servers, else leave 'auto'",
            )
        if self.endpoint_url is not None and not re.match(r"^https?://[^/]+", self.endpoint_url):
            raise ConfigError(
                f"S3: endpoint_url {self.endpoint_url!r} is not an http(s)://host[:port] URL",
                fix="write endpoint_url='https://s3.example.com' (or leave it unset for AWS)",
            )
        for secret in ("access_key_id", "secret_access_key", "session_token"):
            check(getattr(self, secret), f"S3: {secret}")
        for name in ("connect_timeout_s", "request_timeout_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"S3: {name} must be > 0 seconds", fix=f"{name}=10")
        attempts = self.request_attempts
        if isinstance(attempts, bool) or not isinstance(attempts, int) or not 1 <= attempts <= 20:
            raise ConfigError(
                f"S3: request_attempts must be a whole number from 1 to 20, not {attempts!r}",
                fix=f"request_attempts={DEFAULT_REQUEST_ATTEMPTS} (the first attempt included)",
            )

    @property
    def wait_bound_s(self) -> float:
        """The longest a request waits on a server that accepts connections but answers
        nothing: every attempt waits `request_timeout_s`, plus botocore's back-off between
        attempts (at most 1, 2, 4, ... s, capped at 20 s) and `connect_timeout_s` per attempt
        for a server that does not accept connections either."""
        backoff = sum(min(2.0**n, 20.0) for n in range(self.request_attempts - 1))
        return self.request_attempts * (self.request_timeout_s + self.connect_timeout_s) + backoff

    def server(self) -> str:
        """Where requests go, for messages (never a credential)."""
        endpoint = self.endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3")
        endpoint = endpoint or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint:
            return re.sub(r"//[^@/]*@", "//", endpoint)
        return f"AWS S3 ({self.region or os.environ.get('AWS_REGION') or 'default region'})"

    def client(self) -> S3Client:
        """A boto3 S3 client for these settings, shared by everything in this process that
        uses the same settings (boto3 clients are thread-safe)."""
        key = (os.getpid(), self)
        with _CLIENTS_LOCK:
            client = _CLIENTS.get(key)
            if client is None:
                client = _CLIENTS[key] = self._build()
        return client

    def arrow_settings(self) -> dict[str, Any]:
        """These settings as pyarrow.fs.S3FileSystem's (secret references resolved here)."""
        settings: dict[str, Any] = {
            "connect_timeout": self.connect_timeout_s,
            "request_timeout": self.request_timeout_s,
        }
        if self.access_key_id is not None:
            settings["access_key"] = self._secret(self.access_key_id, "access_key_id")
            settings["secret_key"] = self._secret(self.secret_access_key, "secret_access_key")
            if self.session_token is not None:
                settings["session_token"] = self._secret(self.session_token, "session_token")
        if self.region is not None:
            settings["region"] = self.region
        if self.endpoint_url is not None:
            scheme, _, rest = self.endpoint_url.partition("://")
            settings["scheme"] = scheme
            settings["endpoint_override"] = rest.rstrip("/")
        if self.ca_bundle is not None:
            # pyarrow applies it when its S3 layer initialises: the first S3 filesystem of
            # the process decides (docs/security.md).
            settings["tls_ca_file_path"] = self.ca_bundle
        if self.addressing_style == "path":
            settings["force_virtual_addressing"] = False
        elif self.addressing_style == "virtual":
            settings["force_virtual_addressing"] = True
        return settings

    @staticmethod
    def _secret(value: str | None, name: str) -> str | None:
        return None if value is None else resolve(value, f"S3: {name}")

    def _build(self) -> S3Client:
        import boto3
        from botocore.config import Config

        if self.ca_bundle is not None and not os.path.isfile(self.ca_bundle):
            raise ConfigError(
                f"S3: ca_bundle {self.ca_bundle!r} is not a file here",
                fix="give the path of a PEM file of the CAs that signed the server's "
                "certificate, present wherever the job runs (driver and executors)",
            )

        session = boto3.session.Session()
        client: S3Client = session.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=self.region,
            aws_access_key_id=self._secret(self.access_key_id, "access_key_id"),
            aws_secret_access_key=self._secret(self.secret_access_key, "secret_access_key"),
            aws_session_token=self._secret(self.session_token, "session_token"),
            verify=self.ca_bundle,
            config=Config(
                s3={"addressing_style": self.addressing_style},
                # total_max_attempts counts the first attempt (max_attempts would not).
                retries={"total_max_attempts": self.request_attempts, "mode": "standard"},
                connect_timeout=self.connect_timeout_s,
                read_timeout=self.request_timeout_s,
                # A peer gone at the TCP level (host down, packets dropped) is noticed by the
                # read time-out in any case; keepalives also end connections idle in the pool.
                tcp_keepalive=True,
                max_pool_connections=16,
                # Only where the operation demands one: some S3-compatible servers reject
                # the CRC32 trailers boto3 adds to every upload by default.
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
            ),
        )
        return client


def connection_of(settings: object) -> S3Connection:
    """The S3Connection of a sink's settings object that has the same-named fields (the S3
    and Delta sinks' configurations)."""
    names = S3Connection.__dataclass_fields__
    return S3Connection(**{name: getattr(settings, name) for name in names})


_CLIENTS: dict[tuple[int, S3Connection], S3Client] = {}
_CLIENTS_LOCK = threading.Lock()


# -- what a failed request means ----------------------------------------------------------------

#: Error codes that mean the settings are wrong (credentials, permissions, the bucket): no
#: retry helps. Each with the fix the message carries.
_REFUSED = {
    "AccessDenied": "grant the job's identity the S3 actions listed in docs/s3.md on this "
    "bucket and prefix",
    # HEAD requests get no error body: a bare 403 is AccessDenied or a bad signature.
    "403": "check the credentials, and grant the job's identity the S3 actions listed in "
    "docs/s3.md on this bucket and prefix",
    "AllAccessDisabled": "the bucket's owner has disabled all access to it",
    "InvalidAccessKeyId": "check the access key id (access_key_id or AWS_ACCESS_KEY_ID)",
    "SignatureDoesNotMatch": "check the secret access key (secret_access_key or "
    "AWS_SECRET_ACCESS_KEY) and the region",
    "ExpiredToken": "renew the session credentials (session_token or AWS_SESSION_TOKEN)",
    "InvalidToken": "check the session token (session_token or AWS_SESSION_TOKEN)",
    "TokenRefreshRequired": "renew the session credentials",
    "AccountProblem": "the account behind these credentials cannot use S3; see its console",
    "NoSuchBucket": "create the bucket first (durable-sinks never creates buckets), or fix "
    "the bucket in the path",
    "InvalidBucketName": "fix the bucket name in the path",
    "PermanentRedirect": "the bucket is in another region: set region= to the bucket's region",
    "AuthorizationHeaderMalformed": "set region= to the bucket's region",
    "NotImplemented": "this S3 server does not implement the request durable-sinks needs "
    "(docs/s3.md lists them)",
}
#: Error codes that are worth a retry (throttling, the server busy or restarting).
_RETRIABLE = frozenset(
    {
        "SlowDown",
        "ServiceUnavailable",
        "InternalError",
        "RequestTimeout",
        "RequestTimeTooSkewed",
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "OperationAborted",
    }
)


def error_code(exc: BaseException) -> str | None:
    """The S3 error code of a botocore ClientError (`NoSuchKey`, `PreconditionFailed`, ...);
    HTTP status codes stand in where the server sent no body (`404`, `412`)."""
    from botocore.exceptions import ClientError

    if not isinstance(exc, ClientError):
        return None
    error = exc.response.get("Error", {})
    code = error.get("Code")
    if code:
        return str(code)
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return str(status) if status else None


def is_missing(exc: BaseException) -> bool:
    """Whether a request failed because the key (or upload) does not exist."""
    return error_code(exc) in ("NoSuchKey", "404", "NotFound", "NoSuchUpload")


def is_precondition_failed(exc: BaseException) -> bool:
    """A conditional write refused: the key exists (If-None-Match) or changed (If-Match).
    `ConditionalRequestConflict` (409) is AWS's answer to a concurrent conditional write."""
    return error_code(exc) in ("PreconditionFailed", "412", "ConditionalRequestConflict")


def _ssl_reason(exc: BaseException) -> str:
    """The innermost words of a certificate failure ("hostname '127.0.0.1' doesn't match
    'localhost'", "unable to get local issuer certificate")."""
    text = str(exc)
    found = re.search(
        r"(hostname .*? doesn't match [^\s,)]+|certificate verify failed: [^(]+)", text
    )
    return found.group(1).strip() if found else text


def s3_failure(
    exc: BaseException,
    action: str,
    connection: S3Connection,
    *,
    job: str | None = None,
    sink: str | None = None,
    epoch: int | None = None,
) -> DurableSinkError:
    """The typed error for a failed request: `action` says what was attempted ("upload part
    3 of s3://b/k"). Unreachable servers and throttling are retriable, refused settings are a
    ConfigError with their fix, anything else is a DurableSinkError carrying the code."""
    from botocore.exceptions import (
        ClientError,
        ConnectionClosedError,
        ConnectTimeoutError,
        EndpointConnectionError,
        NoCredentialsError,
        PartialCredentialsError,
        ReadTimeoutError,
        SSLError,
    )

    def made(cls: type[DurableSinkError], text: str, fix: str | None = None) -> DurableSinkError:
        return cls(text, job=job, sink=sink, epoch=epoch, fix=fix)

    server = connection.server()
    if isinstance(exc, NoCredentialsError | PartialCredentialsError):
        return made(
            ConfigError,
            f"cannot {action}: no S3 credentials found ({type(exc).__name__})",
            fix="give access_key_id and secret_access_key, or set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY (or a profile or role) where the job runs",
        )
    if isinstance(exc, SSLError):
        return made(
            ConfigError,
            f"cannot {action}: cannot verify the TLS certificate of S3 at {server}: "
            f"{_ssl_reason(exc)}",
            fix="set ca_bundle (or AWS_CA_BUNDLE) to the CA file that signed the server's "
            "certificate, and use a host name the certificate names in endpoint_url; "
            "retrying cannot help",
        )
    if isinstance(exc, EndpointConnectionError | ConnectTimeoutError):
        return made(
            UnreachableError,
            f"cannot {action}: S3 at {server} is unreachable ({type(exc).__name__})",
            fix="check that the server runs and that endpoint_url reaches it; the job rides "
            "out a short outage and may be restarted once it answers",
        )
    if isinstance(exc, ConnectionClosedError | ReadTimeoutError):
        return made(
            TransientError,
            f"cannot {action}: S3 at {server} dropped the request ({type(exc).__name__})",
            fix="a retry may succeed; check the network and request_timeout_s",
        )
    if isinstance(exc, ClientError):
        code = error_code(exc) or "unknown"
        message = exc.response.get("Error", {}).get("Message") or ""
        text = f"cannot {action}: S3 at {server} answered {code}" + (
            f" ({message})" if message else ""
        )
        if code in _REFUSED:
            return made(ConfigError, text, f"{_REFUSED[code]}; retrying cannot help")
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        if code in _RETRIABLE or status >= 500 or status == 429:
            return made(TransientError, text, "a retry may succeed once the server recovers")
        return made(DurableSinkError, text)
    from botocore.exceptions import BotoCoreError

    if isinstance(exc, BotoCoreError):  # other transport trouble (SSL, proxies, ...)
        return made(
            TransientError,
            f"cannot {action}: {type(exc).__name__}: {exc}",
            fix="check the connection to the S3 server",
        )
    return made(DurableSinkError, f"cannot {action}: {type(exc).__name__}: {exc}")


# -- object checks ------------------------------------------------------------------------------


def multipart_etag(part_etags: list[str]) -> str | None:
    """The ETag S3 gives the object a multipart upload of these parts completes into
    (MD5 of the parts' MD5s, `-<count>`), or None when a part's ETag is not an MD5 (then
    only the object's metadata identifies it)."""
    digest = hashlib.md5(usedforsecurity=False)
    for etag in part_etags:
        try:
            raw = binascii.unhexlify(etag.strip('"'))
        except (binascii.Error, ValueError):
            return None
        if len(raw) != 16:
            return None
        digest.update(raw)
    return f'"{digest.hexdigest()}-{len(part_etags)}"'


def conditional_write_problem(client: S3Client, bucket: str, key_prefix: str) -> str | None:
    """None when the server honours the conditional writes durable-sinks relies on, else what
    it got wrong (for a ConfigError). Checks, on one probe object under `key_prefix` (deleted
    again): a create with `If-None-Match: *` succeeds, a second one is refused (412), a PUT
    with `If-Match` on a wrong ETag is refused and one on the right ETag succeeds. A server
    that ignores the conditions (older S3-compatible servers, some proxies) would let two
    writers both believe they won. Errors other than the refusals expected are raised as
    botocore raised them (translate them with `s3_failure`).

    The probe key is new (a random name), so a refusal of a write that was meant to succeed
    is read back before it counts: botocore retries a request whose answer was lost, and the
    retry of a create or of an If-Match PUT that took effect is refused by its own effect."""
    from botocore.exceptions import ClientError

    def refused(put: Callable[[], object]) -> bool:
        try:
            put()
        except ClientError as exc:
            if is_precondition_failed(exc):
                return True
            raise
        return False

    def holds(body: bytes) -> bool:
        return bytes(client.get_object(Bucket=bucket, Key=key)["Body"].read()) == body

    key = f"{key_prefix}conditional-probe-{uuid.uuid4().hex}"
    first, second, third = (f"{n}-{uuid.uuid4().hex}".encode() for n in range(3))
    created = not refused(
        lambda: client.put_object(Bucket=bucket, Key=key, Body=first, IfNoneMatch="*")
    )
    if not created and not holds(first):  # pragma: no cover - a random key someone else wrote
        return "it refused If-None-Match: * on a new key"
    try:
        if not refused(
            lambda: client.put_object(Bucket=bucket, Key=key, Body=second, IfNoneMatch="*")
        ):
            return "it ignores If-None-Match: * (a second create of one key was accepted)"
        current = client.head_object(Bucket=bucket, Key=key)["ETag"]
        wrong = '"00000000000000000000000000000000"'
        if current == wrong:  # pragma: no cover - an MD5 nobody writes
            wrong = '"11111111111111111111111111111111"'
        if not refused(
            lambda: client.put_object(Bucket=bucket, Key=key, Body=second, IfMatch=wrong)
        ):
            return "it ignores If-Match (a PUT on a wrong ETag was accepted)"
        if refused(
            lambda: client.put_object(Bucket=bucket, Key=key, Body=third, IfMatch=current)
        ) and not holds(third):
            return "it refuses If-Match on the object's own ETag"
    finally:
        client.delete_object(Bucket=bucket, Key=key)
    return None


def probe_conditional_writes(client: S3Client, bucket: str, key_prefix: str) -> bool:
    """Whether the server honours `If-None-Match: *` and `If-Match` on PUT (see
    `conditional_write_problem`, which says what is wrong)."""
    return conditional_write_problem(client, bucket, key_prefix) is None
