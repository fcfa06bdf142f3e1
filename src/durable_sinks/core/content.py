"""An epoch's content summary: how many rows it held and an order-independent digest of them.

The coordinator computes it while an epoch's record batches stream through (driver mode) and
keeps it in the epoch's decision record; when Spark replays a decided epoch, the replayed rows
are summarised the same way and compared (coordinator/_replay.py, docs/operations.md "Replay
check"). It depends on the rows alone, never on a sink.

The digest (algorithm `ALGORITHM`) is the sum modulo 2**64 of one 64-bit hash per row, so it is
the same whatever the order of the rows, of the record batches and of Spark's partitions, and
whatever the batches' sizes; a row given twice counts twice (a multiset hash). A row's hash is
the splitmix64 finaliser of a weighted sum of its values' 64-bit words, each column (and each
word of a value) weighted by its own odd key derived from a hash of the column names and types
(so the same values under other names differ); a null adds a key of its own instead of a value.
One changed word in a row always changes the row's hash. Values as words:

- fixed-width values (integers, dates, times, timestamps, durations, decimals): their bits;
  floats with -0.0 as 0.0 and every NaN as one NaN; booleans as 0/1;
- strings and binaries: a weighted sum of their 8-byte words (the last one zero padded), each
  weighted by its position, plus their length; `string`, `large_string` and `string_view`
  hash alike (and the binaries);
- structs: the weighted sum of their fields' words; lists and maps: the sum of their elements'
  finalised hashes (weighted by position in a list; a map's entries in any order), plus the
  length;
- dictionary-encoded values as the values; any other type through a slow per-row fallback.

Everything is vectorised with numpy over the Arrow buffers (no Python loop per row); measured
cost: docs/operations.md "Replay check". It is a check against accidents (a non-deterministic
query), not against an adversary: 64 bits, not a cryptographic hash.
"""

from __future__ import annotations

import functools
import hashlib
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .protocol import JSON
from .threads import process_pool

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

    U64 = np.ndarray[Any, np.dtype[np.uint64]]

#: The digest's algorithm, kept beside it: digests of different algorithms are not compared.
ALGORITHM = "rowsum64-1"
_MASK = (1 << 64) - 1
_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_GOLDEN = 0x9E3779B97F4A7C15  # weighs a word's position
_LENGTH = 0xD6E8FEB86659FD93  # weighs a string's or list's length
_NULL = 0xC2B2AE3D27D4EB4F  # a null's key (beside its column's)


@dataclass(frozen=True)
class ContentSummary:
    """`rows` rows whose digest is `digest` (16 hex digits; None when only rows were
    counted), computed by `algorithm`."""

    rows: int
    digest: str | None = None
    algorithm: str = ALGORITHM

    def to_json(self) -> dict[str, JSON]:
        data: dict[str, JSON] = {"rows": self.rows, "algorithm": self.algorithm}
        if self.digest is not None:
            data["digest"] = self.digest
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ContentSummary:
        """KeyError, TypeError or ValueError when `data` is not a summary's JSON."""
        if not isinstance(data, Mapping):
            raise TypeError(f"content summary is a {type(data).__name__}, not an object")
        rows = data["rows"]
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
            raise ValueError(f"content summary rows {rows!r} is not a row count")
        digest = data.get("digest")
        return cls(rows, None if digest is None else str(digest), str(data["algorithm"]))

    def differs_from(self, other: ContentSummary) -> bool:
        """True when the two cannot hold the same rows: other row counts, or digests of one
        algorithm that differ. A digest missing on either side (or of another algorithm)
        compares the counts alone."""
        if self.rows != other.rows:
            return True
        comparable = self.algorithm == other.algorithm and None not in (self.digest, other.digest)
        return comparable and self.digest != other.digest

    def __str__(self) -> str:
        return f"{self.rows} rows" + (f", digest {self.digest}" if self.digest else "")


class ContentTally:
    """Accumulates the summary of the record batches given to `add` (or passed `through`);
    with `digest=False` it only counts rows."""

    def __init__(self, *, digest: bool = True) -> None:
        self.rows = 0
        self._digest = digest
        self._sum = 0
        self._seeds: dict[pa.Schema, int] = {}
        #: Row-hash sums being computed on the hashing thread (`through`), with the bytes
        #: of the batches they hold.
        self._pending: deque[tuple[Future[int], int]] = deque()
        self._pending_bytes = 0

    def _seed(self, schema: pa.Schema) -> int:
        seed = self._seeds.get(schema)
        if seed is None:
            seed = self._seeds.setdefault(schema, _schema_seed(schema))
        return seed

    def add(self, batch: pa.RecordBatch) -> None:
        self.rows += batch.num_rows
        if self._digest and batch.num_rows:
            self._sum = (self._sum + row_hash_sum(batch, self._seed(batch.schema))) & _MASK

    def through(self, batches: Iterable[Any]) -> Iterator[Any]:
        """`batches` unchanged, each record batch added on its way (anything else passes
        untouched for the consumer to refuse). The rows are hashed on a thread of their own
        while the consumer writes them (the sum does not depend on the order), at most
        HASH_AHEAD_BYTES of batches behind (then this waits): `summary` waits for the rest,
        and raises what the hashing raised."""
        import pyarrow as pa

        for batch in batches:
            if isinstance(batch, pa.RecordBatch):
                self.rows += batch.num_rows
                if self._digest and batch.num_rows:
                    seed = self._seed(batch.schema)
                    hashing = _hashing().submit(row_hash_sum, batch, seed)
                    self._pending.append((hashing, batch.nbytes))
                    self._pending_bytes += batch.nbytes
                    while self._pending_bytes > HASH_AHEAD_BYTES:
                        self._fold_oldest()
            yield batch

    def _fold_oldest(self) -> None:
        hashing, size = self._pending.popleft()
        self._pending_bytes -= size
        self._sum = (self._sum + hashing.result()) & _MASK

    def summary(self) -> ContentSummary:
        while self._pending:
            self._fold_oldest()
        return ContentSummary(self.rows, f"{self._sum:016x}" if self._digest else None)


#: Bytes of record batches `ContentTally.through` lets the hashing thread fall behind by (they
#: stay in memory until hashed). The hashing falls behind only when the sinks take the rows
#: faster than it hashes them: sinks that gather an epoch's rows for a file (Iceberg, Delta,
#: S3 gather up to a row group), which hold those batches anyway until they encode them at
#: pre-commit. The bound decides whether the hashing of an epoch's last rows overlaps that
#: encoding or holds up the write: a 1,000,000-row (113 MB) epoch into Iceberg took 331 ms
#: with 64 MiB, 303 ms with 256 MiB.
HASH_AHEAD_BYTES = 256 * 1024 * 1024


def _hashing() -> ThreadPoolExecutor:
    """This process's hashing thread."""
    return process_pool("durable-sinks-tally", 1)


def summarise(batches: Iterable[pa.RecordBatch], *, digest: bool = True) -> ContentSummary:
    """The summary of all of `batches`."""
    tally = ContentTally(digest=digest)
    for batch in batches:
        tally.add(batch)
    return tally.summary()


def row_hash_sum(batch: pa.RecordBatch, seed: int) -> int:
    """The sum modulo 2**64 of the hashes of `batch`'s rows (keys derived from `seed`)."""
    return int(row_hashes(batch, seed).sum(dtype="uint64"))


def row_hashes(batch: pa.RecordBatch, seed: int) -> U64:
    """One hash per row of `batch`: its columns' words weighted by keys derived from `seed`,
    summed, finalised."""
    import numpy as np

    total = np.full(batch.num_rows, seed, dtype=np.uint64)
    for index, column in enumerate(batch.columns):
        _add(total, column, _key(seed, index))
    return _mix(total)


def _schema_seed(schema: pa.Schema) -> int:
    text = "\x1f".join(f"{f.name}\x1e{_type_name(f.type)}" for f in schema)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def _type_name(t: pa.DataType) -> str:
    """A type's name with the offset width and view layout left out (they hash alike)."""
    return (
        str(t)
        .replace("large_string", "string")
        .replace("large_binary", "binary")
        .replace("string_view", "string")
        .replace("binary_view", "binary")
        .replace("large_list", "list")
    )


def _key(seed: int, index: int) -> int:
    """An odd 64-bit key, the `index`-th derived from `seed` (splitmix64)."""
    x = (seed + (index + 1) * _GOLDEN) & _MASK
    x = ((x ^ (x >> 30)) * _M1) & _MASK
    x = ((x ^ (x >> 27)) * _M2) & _MASK
    return (x ^ (x >> 31)) | 1


def _mix(x: U64) -> U64:
    """splitmix64's finaliser, in place."""
    import numpy as np

    x ^= x >> np.uint64(30)
    x *= np.uint64(_M1)
    x ^= x >> np.uint64(27)
    x *= np.uint64(_M2)
    x ^= x >> np.uint64(31)
    return x


def _add(total: U64, column: pa.Array, key: int) -> None:
    """Add `column`'s words, weighted by keys derived from `key`, to `total` (one entry per
    row), in place; a null adds a key instead."""
    import numpy as np

    valid = _validity(column)
    for index, word in enumerate(_words(column, key)):
        if valid is not None:
            word *= valid
        word *= np.uint64(_key(key, index))
        total += word
    if valid is not None:
        nulls = valid.astype(np.uint64)
        nulls -= np.uint64(1)  # all ones where null, 0 where valid
        nulls &= np.uint64(_key(key, -1) ^ _NULL)
        total += nulls


def _validity(column: pa.Array) -> np.ndarray[Any, np.dtype[np.uint8]] | None:
    """1 where `column` holds a value, 0 where null; None when nothing is null."""
    import numpy as np
    import pyarrow as pa

    if not column.null_count:
        return None
    if pa.types.is_null(column.type):
        return np.zeros(len(column), dtype=np.uint8)
    bitmap = column.buffers()[0]
    if bitmap is None:  # (unions, run-end encoded: no validity buffer of their own)
        return np.asarray(column.is_valid().to_numpy(zero_copy_only=False), dtype=np.uint8)
    return _bits(bitmap, column.offset, len(column))


def _bits(buffer: pa.Buffer, offset: int, count: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """Bits `offset` to `offset + count` of a bitmap, one byte (0 or 1) each."""
    import numpy as np

    first = offset // 8
    packed = np.frombuffer(buffer, dtype=np.uint8)[first : (offset + count + 7) // 8]
    start = offset - 8 * first
    result: np.ndarray[Any, np.dtype[np.uint8]]
    result = np.unpackbits(packed, bitorder="little")[start : start + count]
    return result


def _words(column: pa.Array, key: int) -> list[U64]:
    """The uint64 words standing for each value of `column` (fresh arrays the caller may
    change; what they hold at null slots does not matter). `key`: the column's key, for
    nested values' own weights."""
    import numpy as np
    import pyarrow as pa

    t = column.type
    n = len(column)
    if pa.types.is_dictionary(t):
        return _words(column.dictionary_decode(), key)
    if pa.types.is_boolean(t):
        return [_bits(column.buffers()[1], column.offset, n).astype(np.uint64)]
    if pa.types.is_floating(t):
        values = _fixed(column, t.byte_width).view(f"<f{t.byte_width}").astype(np.float64)
        values += 0.0  # -0.0 becomes 0.0
        nan = np.isnan(values)
        if nan.any():
            values[nan] = np.nan
        return [values.view(np.uint64)]
    if _is_fixed(t) and t.byte_width > 8:  # decimal128/256, month_day_nano intervals
        raw = _fixed(column, t.byte_width).view(np.uint64).reshape(n, t.byte_width // 8)
        return [raw[:, i].copy() for i in range(t.byte_width // 8)]
    if _is_fixed(t):
        return [_fixed(column, t.byte_width).view(f"<u{t.byte_width}").astype(np.uint64)]
    if pa.types.is_null(t):
        return [np.zeros(n, dtype=np.uint64)]
    if pa.types.is_fixed_size_binary(t):
        return [_binary_words(column.cast(pa.binary()))]
    if pa.types.is_string_view(t):
        return [_binary_words(column.cast(pa.large_string()))]
    if pa.types.is_binary_view(t):
        return [_binary_words(column.cast(pa.large_binary()))]
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return [_binary_words(column)]
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return [_binary_words(column)]
    if pa.types.is_struct(t):
        fields = np.zeros(n, dtype=np.uint64)
        for index, child in enumerate(column.flatten()):
            _add(fields, child, _key(key, index))
        return [fields]
    if pa.types.is_map(t):  # as a list of key/value structs, in any order
        entries = pa.struct([t.key_field, t.item_field])
        return [_list_words(column.cast(pa.list_(entries)), key, ordered=False)]
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return [_list_words(column, key, ordered=True)]
    return [_fallback(column)]


def _is_fixed(t: pa.DataType) -> bool:
    import pyarrow as pa

    return (
        pa.types.is_integer(t)
        or pa.types.is_temporal(t)
        or pa.types.is_decimal(t)
        or pa.types.is_interval(t)
    ) and t.byte_width in (1, 2, 4, 8, 16, 32)


def _fixed(column: pa.Array, width: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """The values buffer of a fixed-width column as bytes, `width` per row, from its offset."""
    import numpy as np

    start = column.offset * width
    buffer = np.frombuffer(column.buffers()[1], dtype=np.uint8)
    return buffer[start : start + len(column) * width]


@functools.cache
def _word_masks() -> U64:
    """The masks keeping a word's first 0..8 bytes."""
    import numpy as np

    return np.array([(1 << (8 * k)) - 1 for k in range(8)] + [_MASK], dtype=np.uint64)


#: Words of a string or binary value hashed word-column by word-column, for every value of a
#: batch at once; a longer value's further words are hashed one by one.
_COLUMNWISE_WORDS = 16


@functools.cache
def _weights(size: int) -> U64:
    """`size` odd 64-bit weights, one per word position in a value."""
    import numpy as np

    weights = np.arange(size, dtype=np.uint64)
    weights *= np.uint64(_GOLDEN)
    weights += np.uint64(_LENGTH)
    mixed = _mix(weights)
    mixed |= np.uint64(1)
    return mixed


def _binary_words(column: pa.Array) -> U64:
    """One word per string or binary value: its 8-byte words (the last one zero padded), the
    k-th weighted by the k-th of `_weights`, summed, plus its length weighted. The first
    `_COLUMNWISE_WORDS` words of every value are read at once (the k-th word of each value,
    then the next); a longer value's further words word by word."""
    import numpy as np
    import pyarrow as pa

    n = len(column)
    large = pa.types.is_large_string(column.type) or pa.types.is_large_binary(column.type)
    offsets = np.frombuffer(column.buffers()[1], dtype="<i8" if large else "<i4")
    offsets = offsets[column.offset : column.offset + n + 1].astype(np.int64)
    first, size = int(offsets[0]), int(offsets[-1] - offsets[0])
    offsets -= first
    lengths = np.diff(offsets)
    valid = _validity(column)
    if valid is not None:
        lengths *= valid  # (the bytes a null may hide are not read)
    result = lengths.astype(np.uint64)
    result *= np.uint64(_LENGTH)
    known = lengths if valid is None else lengths[valid.view(bool)]
    if not size or not known.size:
        return result
    longest, shortest = int(known.max()), int(known.min())
    weights = _weights(1 << ((longest + 7) // 8).bit_length())
    masks = _word_masks()
    data = np.frombuffer(column.buffers()[2], dtype=np.uint8)[first : first + size]
    # every 8-byte window of the data (unaligned reads), zero padded at the end
    padded = np.zeros(size + 8, dtype=np.uint8)
    padded[:size] = data
    windows = np.ndarray((size + 1,), dtype="<u8", buffer=padded, strides=(1,))
    at = offsets[:-1].copy()
    columnwise = min((longest + 7) // 8, _COLUMNWISE_WORDS)
    for k in range(columnwise):
        if 8 * (k + 1) <= shortest:  # a whole word of every value (nulls: anything)
            word = windows[at if valid is None else np.minimum(at, size)]
        else:  # the values' bytes from 8k on, up to 8 of them (none: 0)
            word = windows[np.minimum(at, size)]
            left = lengths - 8 * k
            np.clip(left, 0, 8, out=left)
            word &= masks[left]
        word *= weights[k]
        result += word
        at += 8
    if longest > 8 * columnwise:
        rows = np.flatnonzero(lengths > 8 * columnwise)
        result[rows] += _long_tails(windows, offsets, lengths, rows, columnwise, weights)
    return result


def _long_tails(
    windows: U64,
    offsets: np.ndarray[Any, np.dtype[np.int64]],
    lengths: np.ndarray[Any, np.dtype[np.int64]],
    rows: np.ndarray[Any, np.dtype[np.int64]],
    skip: int,
    weights: U64,
) -> U64:
    """The weighted sum of the words from `skip` on of each value in `rows`."""
    import numpy as np

    words = (lengths[rows] + 7) // 8 - skip
    ends = np.cumsum(words)
    k = np.arange(int(ends[-1]), dtype=np.int64)
    k -= np.repeat(ends - words - skip, words)  # each word's position in its value
    at = np.repeat(offsets[rows], words)
    at += 8 * k
    word = windows[at]
    tail = lengths[rows] - 8 * (skip + words - 1)  # 1..8 bytes in each last word
    word[ends - 1] &= _word_masks()[tail]
    word *= weights[k]
    return _segment_sums(word, ends, words)


def _segment_sums(
    values: U64, ends: np.ndarray[Any, np.dtype[np.int64]], counts: np.ndarray[Any, Any]
) -> U64:
    """The sums (modulo 2**64) of consecutive runs of `values`, `counts` long, ending at
    `ends` (their cumulative sum)."""
    import numpy as np

    sums = np.zeros(len(values) + 1, dtype=np.uint64)
    np.cumsum(values, dtype=np.uint64, out=sums[1:])
    result: U64 = sums[ends] - sums[ends - counts]
    return result


def _list_words(column: pa.Array, key: int, *, ordered: bool) -> U64:
    """One word per list (or map) value: its elements' finalised hashes (weighted by their
    position when `ordered`) summed, plus its length weighted."""
    import numpy as np

    lengths = np.diff(column.offsets.to_numpy().astype(np.int64))
    valid = _validity(column)
    if valid is not None:
        lengths *= valid  # (flatten skips the elements a null list may hide)
    values = column.flatten()  # the non-null lists' elements
    element = np.full(len(values), key, dtype=np.uint64)
    _add(element, values, _key(key, 1))
    ends = np.cumsum(lengths)
    if ordered and len(values):
        position = np.arange(len(values)) - np.repeat(ends - lengths, lengths)
        element += position.astype(np.uint64) * np.uint64(_GOLDEN)
    result = _segment_sums(_mix(element), ends, lengths)
    result += lengths.astype(np.uint64) * np.uint64(_LENGTH)
    return result


def _fallback(column: pa.Array) -> U64:
    """Any other type: a hash of each value's Python repr (a loop per row: slow, and rare)."""
    import numpy as np

    return np.array(
        [
            int.from_bytes(hashlib.blake2b(repr(v).encode(), digest_size=8).digest(), "little")
            for v in column.to_pylist()
        ],
        dtype=np.uint64,
    )
