"""Spark's Iceberg catalog settings made from the pyiceberg catalog properties a sink is given
(tests/support/iceberg_spark_reader.py): the SQL catalog on Postgres becomes Iceberg's
JdbcCatalog on the same database and schema, a REST catalog keeps its properties, S3
properties bring S3FileIO with path-style access."""

from __future__ import annotations

import pytest

from tests.support.iceberg_spark_reader import spark_catalog_settings

PREFIX = "spark.sql.catalog.cat"


def test_a_sql_catalog_on_postgres_becomes_a_jdbc_catalog_on_the_same_schema() -> None:
    settings = spark_catalog_settings(
        "cat",
        {
            "type": "sql",
            "uri": "postgresql+psycopg://ds%40x:p%3Ass@127.0.0.1:15432/ds"
            "?sslmode=disable&connect_timeout=5&options=-csearch_path%3Diceberg_1",
            "warehouse": "file:///tmp/wh",
        },
    )
    assert settings == {
        PREFIX: "org.apache.iceberg.spark.SparkCatalog",
        f"{PREFIX}.type": "jdbc",
        f"{PREFIX}.uri": "jdbc:postgresql://127.0.0.1:15432/ds"
        "?currentSchema=iceberg_1&sslmode=disable",
        f"{PREFIX}.jdbc.user": "ds@x",
        f"{PREFIX}.jdbc.password": "p:ss",
        f"{PREFIX}.warehouse": "file:///tmp/wh",
    }


def test_a_rest_catalog_on_s3_keeps_its_properties_and_reads_through_s3fileio() -> None:
    settings = spark_catalog_settings(
        "cat",
        {
            "type": "rest",
            "uri": "http://127.0.0.1:18335",
            "credential": "AK:SK",
            "warehouse": "s3://tables",
            "s3.endpoint": "http://127.0.0.1:18333",
            "s3.access-key-id": "AK",
            "s3.secret-access-key": "SK",
            "s3.region": "eu-west-1",
        },
    )
    assert settings == {
        PREFIX: "org.apache.iceberg.spark.SparkCatalog",
        f"{PREFIX}.type": "rest",
        f"{PREFIX}.uri": "http://127.0.0.1:18335",
        f"{PREFIX}.credential": "AK:SK",
        f"{PREFIX}.warehouse": "s3://tables",
        f"{PREFIX}.s3.endpoint": "http://127.0.0.1:18333",
        f"{PREFIX}.s3.access-key-id": "AK",
        f"{PREFIX}.s3.secret-access-key": "SK",
        f"{PREFIX}.io-impl": "org.apache.iceberg.aws.s3.S3FileIO",
        f"{PREFIX}.s3.path-style-access": "true",
        f"{PREFIX}.client.region": "eu-west-1",
    }


@pytest.mark.parametrize(
    "properties",
    [
        {"type": "sql", "uri": "sqlite:///catalog.db", "warehouse": "file:///tmp/wh"},
        {"type": "glue"},
    ],
)
def test_a_catalog_spark_cannot_share_is_refused(properties: dict[str, str]) -> None:
    with pytest.raises(ValueError, match=r"sqlite|glue"):
        spark_catalog_settings("cat", properties)
