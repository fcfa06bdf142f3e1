"""The test bed's certificate authority: TLS for Postgres, Kafka's SASL_SSL listener and S3.

Made once per test bed with trustme (a CA and certificates for tests) and kept in
`.services/tls/`, so servers restarted later serve the same certificate:

- `ca.pem`: the CA clients trust;
- `server.pem` / `server.key`: the servers' certificate (chain) and its PKCS#8 key, issued for
  the host name `localhost` only. Clients connect to `localhost`; a client that connects to
  `127.0.0.1` (the same server) sees a certificate for another name: the wrong-host test;
- `server-keystore.pem`: key and chain in one file, for Kafka's PEM keystore;
- `other-ca.pem`: a CA that signed nothing of ours: the wrong-CA test;
- `expired.pem` / `expired.key`: a certificate for `localhost` that expired in 2001.
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass, replace
from pathlib import Path

from cryptography.hazmat.primitives import serialization

from ._steps import COMPLETE, ensure_folder, is_complete

#: The only name the servers' certificate is valid for (see the module docs).
SERVER_NAME = "localhost"
#: The same servers under a name their certificate does not hold.
WRONG_NAME = "127.0.0.1"


@dataclass(frozen=True)
class TestbedTls:
    """Paths of the test bed's TLS files (see the module docs)."""

    __test__ = False  # not a pytest test class

    folder: Path

    @property
    def ca(self) -> Path:
        return self.folder / "ca.pem"

    @property
    def other_ca(self) -> Path:
        return self.folder / "other-ca.pem"

    @property
    def server_cert(self) -> Path:
        return self.folder / "server.pem"

    @property
    def server_key(self) -> Path:
        return self.folder / "server.key"

    @property
    def server_keystore(self) -> Path:
        return self.folder / "server-keystore.pem"

    @property
    def expired_cert(self) -> Path:
        return self.folder / "expired.pem"

    @property
    def expired_key(self) -> Path:
        return self.folder / "expired.key"

    def ensure(self) -> TestbedTls:
        """Make the files once per test bed (a set-up step, tests/services/_steps.py: servers
        start in parallel threads and processes, and each must get the same CA); return
        self."""
        if self.ca.exists() and not is_complete(self.folder):
            # A folder of an older test bed, without the marker: its CA was written last, so
            # it is whole (and running servers serve its certificate: keep it).
            (self.folder / COMPLETE).write_text("TLS material\n")
        ensure_folder("tls", "TLS material", self.folder, self._build)
        return self

    def _build(self, staging: Path) -> None:
        staging.chmod(0o755)  # servers running as other users read the certificates
        _make(replace(self, folder=staging))


def _make(tls: TestbedTls) -> None:
    import trustme

    ca = trustme.CA(organization_name="durable-sinks test bed")
    leaf = ca.issue_cert(SERVER_NAME, organization_name="durable-sinks test bed")
    expired = ca.issue_cert(
        SERVER_NAME,
        not_before=dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc),
        not_after=dt.datetime(2001, 1, 1, tzinfo=dt.timezone.utc),
    )
    key = _pkcs8(leaf.private_key_pem.bytes())
    chain = b"".join(blob.bytes() for blob in leaf.cert_chain_pems)
    _write(tls.other_ca, trustme.CA().cert_pem.bytes())
    _write(tls.server_cert, chain)
    _write(tls.server_key, key, private=True)
    _write(tls.server_keystore, key + chain, private=True)
    _write(tls.expired_cert, b"".join(blob.bytes() for blob in expired.cert_chain_pems))
    _write(tls.expired_key, _pkcs8(expired.private_key_pem.bytes()), private=True)
    _write(tls.ca, ca.cert_pem.bytes())


def _pkcs8(pem: bytes) -> bytes:
    """The key as unencrypted PKCS#8 (`BEGIN PRIVATE KEY`), which Kafka's PEM keystore reads."""
    key = serialization.load_pem_private_key(pem, password=None)
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes, *, private: bool = False) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
