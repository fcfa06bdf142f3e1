"""How a table the sink creates is partitioned (`partition_by`), and whether an existing
table is partitioned as the configuration says.

A partition field is written as in Spark SQL's `PARTITIONED BY`: a column name (identity),
`year(ts)`, `month(ts)`, `day(ts)`, `hour(ts)` (or Spark's plural `years(ts)` ...),
`bucket(16, id)` or `truncate(4, name)`. Each becomes an Iceberg transform (`identity`,
`day`, `bucket[16]`, ...). Parsing loads no client (the configuration is checked with it);
the rest reads pyiceberg's tables.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from durable_sinks.core.errors import ConfigError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.catalog import Catalog
    from pyiceberg.partitioning import PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table

_FIELD = re.compile(
    r"^\s*(?:(?P<function>[A-Za-z_]+)\s*\(\s*(?:(?P<number>\d+)\s*,\s*)?(?P<argument>[^(),\s]+)"
    r"\s*\)|(?P<column>[^(),\s]+))\s*$"
)
_TIME = {
    "year": "year",
    "years": "year",
    "month": "month",
    "months": "month",
    "day": "day",
    "days": "day",
    "hour": "hour",
    "hours": "hour",
}
_SIZED = ("bucket", "truncate")
FORMS = "a column, year(c), month(c), day(c), hour(c), bucket(N, c) or truncate(N, c)"


@dataclass(frozen=True)
class PartitionField:
    """One field of a partition spec: its source column and its Iceberg transform, in the
    transform's own notation (`identity`, `day`, `bucket[16]`, `truncate[4]`)."""

    column: str
    transform: str

    @classmethod
    def parse(cls, text: object, where: str) -> PartitionField:
        """`text` as the user wrote it (module docstring), else a ConfigError naming it."""
        found = _FIELD.match(text) if isinstance(text, str) else None
        if found is None:
            raise ConfigError(
                f"{where}: partition_by entry {text!r} is not {FORMS}",
                fix="partition_by=['day(created_at)', 'bucket(16, customer_id)', 'country']",
            )
        if found["column"] is not None:
            return cls(found["column"], "identity")
        function, number, column = found["function"].lower(), found["number"], found["argument"]
        if function in _TIME and number is None:
            return cls(column, _TIME[function])
        if function in _SIZED and number is not None and int(number) > 0:
            return cls(column, f"{function}[{int(number)}]")
        raise ConfigError(
            f"{where}: partition_by entry {text!r} is not {FORMS}",
            fix="bucket and truncate take a positive number first (bucket(16, id)); the "
            "time transforms a column alone (day(ts))",
        )

    @property
    def kind(self) -> tuple[str, str]:
        """The transform's name and its number, "" for none (`bucket[16]`: bucket, 16)."""
        name, _, size = self.transform.partition("[")
        return name, size.rstrip("]")

    def __str__(self) -> str:
        name, size = self.kind
        if name == "identity":
            return self.column
        return f"{name}({size}, {self.column})" if size else f"{name}({self.column})"


def fields_of(table: Table) -> list[PartitionField]:
    """The table's current partition spec as fields (a column since dropped shows as its
    field id)."""
    schema = table.schema()
    fields = []
    for field in table.spec().fields:
        column = schema.find_column_name(field.source_id) or f"<field {field.source_id}>"
        fields.append(PartitionField(column, str(field.transform)))
    return fields


def differs(table: Table, wanted: Sequence[PartitionField]) -> str | None:
    """None when `table` is partitioned by `wanted`; else how it is partitioned."""
    found = fields_of(table)
    if found == list(wanted):
        return None
    return "[" + ", ".join(repr(str(f)) for f in found) + "]" if found else "nothing"


class UnfitPartitioningError(ValueError):
    """A partition field that names no column of the rows, or whose transform does not take
    its column's type (the message says which)."""


#: A table's schema with its field ids, and a partition spec over it.
Spec = tuple["Schema", "PartitionSpec"]


def spec_for(schema: pa.Schema, fields: Sequence[PartitionField]) -> Spec:
    """The Iceberg schema of `schema` (fresh field ids) and the partition spec of `fields`
    over it, named as pyiceberg and Spark name them (`ts_day`, `id_bucket_16`);
    UnfitPartitioningError when a field does not fit the rows."""
    from pyiceberg.catalog import Catalog
    from pyiceberg.partitioning import PARTITION_FIELD_ID_START, PartitionSpec
    from pyiceberg.partitioning import PartitionField as SpecField
    from pyiceberg.schema import assign_fresh_schema_ids
    from pyiceberg.transforms import parse_transform

    table_schema = assign_fresh_schema_ids(Catalog._convert_schema_if_needed(schema))
    made = []
    for position, field in enumerate(fields):
        column = table_schema.find_field(field.column) if field.column in schema.names else None
        if column is None:
            raise UnfitPartitioningError(
                f"{str(field)!r}: the rows have no column {field.column!r}"
            )
        transform = parse_transform(field.transform)
        if not transform.can_transform(column.field_type):
            raise UnfitPartitioningError(
                f"{str(field)!r}: {field.transform} does not take column {field.column!r} of "
                f"type {column.field_type}"
            )
        name, size = field.kind
        if name == "identity":
            suffix = ""
        else:
            suffix = f"_{'trunc' if name == 'truncate' else name}" + (f"_{size}" if size else "")
        made.append(
            SpecField(
                source_id=column.field_id,
                field_id=PARTITION_FIELD_ID_START + position,
                transform=transform,
                name=field.column + suffix,
            )
        )
    return table_schema, PartitionSpec(*made)


def create_table(
    catalog: Catalog, identifier: tuple[str, ...], schema: pa.Schema, spec: Spec | None
) -> Table:
    """The table created from `schema`, or with `spec` (`spec_for`) its schema and partition
    spec, in one catalog commit; the table another writer created first, as it is (the caller
    checks its spec)."""
    if spec is None:
        return catalog.create_table_if_not_exists(identifier, schema=schema)
    table_schema, partition_spec = spec
    return catalog.create_table_if_not_exists(
        identifier, schema=table_schema, partition_spec=partition_spec
    )
