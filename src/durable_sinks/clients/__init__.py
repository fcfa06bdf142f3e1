"""The clients layer: how the product reaches the servers that more than one of its sinks and
decision stores talk to (S3 and Postgres), between the foundation (`durable_sinks.core`, which
loads no client library) and the sinks and stores above. Each module loads its client library
only when a client is built or one of its errors is translated."""
