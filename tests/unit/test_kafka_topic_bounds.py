"""A Kafka sink without a `topic` option: what its configuration must say (a progress topic,
bounds before it may create topics, no bounds beside `topic`), and which topics rows may name."""

from __future__ import annotations

import pytest

from durable_sinks.core.errors import ConfigError
from durable_sinks.sinks.kafka import Kafka

BROKERS = "127.0.0.1:9092"


def test_a_topic_per_row_needs_a_progress_topic_of_its_own_name() -> None:
    with pytest.raises(ConfigError, match="needs a progress topic of its own name") as raised:
        Kafka(BROKERS)
    assert "progress_topic=" in (raised.value.fix or "")
    assert "topic= for one topic" in (raised.value.fix or "")
    assert Kafka(BROKERS, progress_topic="p").progress_topic_name == "p"


def test_bounds_beside_the_topic_option_are_refused_since_the_option_wins() -> None:
    for options in ({"topics": ("a",)}, {"topic_pattern": "a.*"}, {"topic_column": "kind"}):
        with pytest.raises(ConfigError, match="takes precedence over a topic column"):
            Kafka(BROKERS, "events", **options)


def test_creating_topics_needs_bounds_so_a_bad_row_cannot_create_one() -> None:
    with pytest.raises(ConfigError, match="any row could create a topic") as raised:
        Kafka(BROKERS, progress_topic="p", create_topic=True)
    assert "topics=['orders', 'refunds']" in (raised.value.fix or "")
    Kafka(BROKERS, progress_topic="p", create_topic=True, topics=("a",))
    Kafka(BROKERS, progress_topic="p", create_topic=True, topic_pattern="a.*")


def test_bad_bounds_are_named() -> None:
    with pytest.raises(ConfigError, match="topics holds 'a b', which is not a valid topic"):
        Kafka(BROKERS, progress_topic="p", topics=("a b",))
    with pytest.raises(ConfigError, match=r"topic_pattern '\(' is not a regular expression"):
        Kafka(BROKERS, progress_topic="p", topic_pattern="(")
    with pytest.raises(ConfigError, match="progress_topic 'events-p' is among the topics"):
        Kafka(BROKERS, progress_topic="events-p", topic_pattern="events.*")


def test_rows_may_name_a_listed_topic_or_one_matching_the_whole_pattern() -> None:
    either = Kafka(BROKERS, progress_topic="p", topics=("audit",), topic_pattern=r"events\.\w+")
    assert either.allows("audit")
    assert either.allows("events.orders")
    assert not either.allows("events.orders.old")  # the whole name must match
    assert not either.allows("xevents.orders")
    assert not either.allows("auditx")
    assert either.bounds() == r"topics=['audit'] or topic_pattern='events\\.\\w+'"
    anything = Kafka(BROKERS, progress_topic="p")
    assert anything.allows("whatever")
    assert anything.bounds() == "any existing topic"


def test_a_list_of_topics_is_kept_as_a_tuple() -> None:
    config = Kafka(BROKERS, progress_topic="p", topics=["a", "b"])  # type: ignore[arg-type]
    assert config.topics == ("a", "b")
