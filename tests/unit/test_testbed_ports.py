"""The test bed's ports: the Iceberg REST catalog's is one of the layout's, moves with the S3
port (fresh machines and private beds), and collides with no other."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.fresh_machine import PRIVATE_OFFSETS, layout_of, port_environment, wanted_ports
from tests.services import Layout


def test_the_iceberg_catalog_port_follows_the_s3_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DS_S3_PORT", "20333")
    monkeypatch.delenv("DS_S3_ICEBERG_PORT", raising=False)
    assert Layout.from_env().s3.iceberg == 20335
    monkeypatch.setenv("DS_S3_ICEBERG_PORT", "24000")
    assert Layout.from_env().ports()["s3.iceberg"] == 24000


def test_no_two_roles_share_a_port_and_shifting_moves_the_catalog() -> None:
    base = layout_of({})
    moved = layout_of(port_environment(2000))
    assert moved.s3.iceberg == base.s3.iceberg + 2000
    for layout in (base, moved, base.shifted(200, base.root)):
        shared = [p for p, n in Counter(layout.ports().values()).items() if n > 1]
        assert shared == [], f"ports used twice: {shared}"
    assert base.s3.iceberg in wanted_ports(base)
    assert base.shifted(PRIVATE_OFFSETS[-1], base.root).s3.iceberg == base.s3.iceberg + 400
    assert not wanted_ports(base) & wanted_ports(moved)
