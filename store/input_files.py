"""Reading input files (JSON Lines, CSV, Parquet, a `datasets` directory) row by row, and checking fields.

Shared by prompt and preference import. Every problem is a BadInput naming the file, the line or
row, and the field, so an importer can check a whole file before it writes anything.
"""

import codecs
import csv
import gzip
import json
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from store.db import BadInput

ROLES = ("system", "user", "assistant")

Messages = list[dict[str, str]]


@dataclass(frozen=True)
class ImportLimits:
    """How much of an input file is read before it is refused: a bound on the memory an import takes,
    whatever the file holds (a .gz of a few MiB can hold gigabytes)."""

    max_mb: int = 256  # uncompressed
    max_rows: int = 500_000

    @property
    def max_bytes(self) -> int:
        return self.max_mb * 2**20


def read_rows(path: Path, limits: ImportLimits = ImportLimits()) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each row of the file with where it is ("line 3" or "row 3"), as a dict of its fields."""
    name = str(path)
    if not path.exists():
        raise BadInput(name, "file", "does not exist")
    suffixes = "".join(path.suffixes[-2:]).lower()
    if path.is_dir():
        rows = _dataset_rows(path, name, limits)
    elif suffixes.endswith((".jsonl", ".jsonl.gz", ".ndjson")):
        rows = _jsonl_rows(path, name, limits)
    elif suffixes.endswith((".csv", ".csv.gz")):
        rows = _csv_rows(path, name, limits)
    elif suffixes.endswith(".parquet"):
        rows = _parquet_rows(path, name, limits)
    else:
        raise BadInput(name, "file", "unknown format: use .jsonl, .csv, .parquet (optionally .gz for text) or a datasets directory")
    for number, row in enumerate(rows, start=1):
        if number > limits.max_rows:
            raise _too_many_rows(name, limits)
        yield row


def _too_many_rows(name: str, limits: ImportLimits) -> BadInput:
    return BadInput(name, "file", f"has more than {limits.max_rows:,} rows, the limit set by [server] max_import_rows")


def _too_large(name: str, limits: ImportLimits, when: str = "") -> BadInput:
    return BadInput(name, "file", f"is larger than {limits.max_mb:,} MiB{when}, the limit set by [server] max_import_mb")


def _lines(path: Path, name: str, limits: ImportLimits) -> Iterator[bytes]:
    """The lines of a text file, read one at a time; a .gz is decompressed as a stream.

    A .gz is decompressed twice: first only to measure it, in chunks, so that a file over the
    limit is refused before anything of it is kept in memory.
    """
    if path.suffix.lower() != ".gz":
        if path.stat().st_size > limits.max_bytes:
            raise _too_large(name, limits)
        with path.open("rb") as f:
            yield from f
        return
    size = 0
    try:
        with gzip.open(path, "rb") as f:
            while size <= limits.max_bytes and (chunk := f.read(2**20)):
                size += len(chunk)
    except (OSError, EOFError, zlib.error) as e:
        raise BadInput(name, "file", f"not a readable gzip file ({e})") from None
    if size > limits.max_bytes:
        raise _too_large(name, limits, " when decompressed")
    with gzip.open(path, "rb") as f:
        yield from f


def _jsonl_rows(path: Path, name: str, limits: ImportLimits) -> Iterator[tuple[str, dict[str, Any]]]:
    for number, raw in enumerate(_lines(path, name, limits), start=1):
        where = f"line {number}"
        text = _decode(raw, name, where)
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as e:
            raise BadInput(name, where, f"not valid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(row, dict):
            raise BadInput(name, where, f"expected a JSON object, got {type_name(row)}")
        yield where, row


def _csv_rows(path: Path, name: str, limits: ImportLimits) -> Iterator[tuple[str, dict[str, Any]]]:
    def text_lines() -> Iterator[str]:
        for number, raw in enumerate(_lines(path, name, limits), start=1):
            yield _decode(raw[3:] if number == 1 and raw.startswith(codecs.BOM_UTF8) else raw, name, f"line {number}")

    reader = csv.DictReader(text_lines())
    try:
        for row in reader:
            # An empty CSV cell means "not given": CSV cannot tell "" from a missing value.
            yield f"line {reader.line_num}", {k: (v if v != "" else None) for k, v in row.items() if k is not None}
    except csv.Error as e:
        raise BadInput(name, f"line {reader.line_num}", f"malformed CSV ({e})") from None


def _parquet_rows(path: Path, name: str, limits: ImportLimits) -> Iterator[tuple[str, dict[str, Any]]]:
    """The rows, a batch at a time, after the file's own account of its rows and uncompressed size is checked."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        file = pq.ParquetFile(path)
    except Exception as e:
        raise BadInput(name, "file", f"not a readable Parquet file ({e})") from None
    meta = file.metadata
    if meta.num_rows > limits.max_rows:
        raise _too_many_rows(name, limits)
    if sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups)) > limits.max_bytes:
        raise _too_large(name, limits, " uncompressed")
    number = size = 0
    try:
        for batch in file.iter_batches():
            size += batch.nbytes  # in case the metadata understated it
            if size > limits.max_bytes:
                raise _too_large(name, limits, " uncompressed")
            for row in batch.to_pylist():
                number += 1
                yield f"row {number}", row
    except (OSError, pa.ArrowException) as e:
        raise BadInput(name, f"row {number + 1}", f"not a readable Parquet file ({e})") from None


def _dataset_rows(path: Path, name: str, limits: ImportLimits) -> Iterator[tuple[str, dict[str, Any]]]:
    import datasets

    try:
        dataset = datasets.load_from_disk(str(path))
    except Exception as e:
        raise BadInput(name, "directory", f"not a datasets directory saved with save_to_disk ({e})") from None
    if isinstance(dataset, datasets.DatasetDict):
        splits = ", ".join(dataset)
        raise BadInput(name, "directory", f"holds the splits {splits}: give the directory of one split, e.g. {path / next(iter(dataset))}")
    if len(dataset) > limits.max_rows:
        raise _too_many_rows(name, limits)
    if dataset.data.nbytes > limits.max_bytes:
        raise _too_large(name, limits)
    for number, row in enumerate(dataset, start=1):
        yield f"row {number}", row


def chat(value: Any, file: str, where: str, field: str) -> Messages:
    """A non-empty list of {"role", "content"} messages with known roles and non-blank text."""
    if not isinstance(value, list) or not value:
        raise BadInput(file, where, f"must be a non-empty list of messages, got {type_name(value)}", field=field)
    messages = []
    for i, message in enumerate(value):
        at = f"{field}[{i}]"
        if not isinstance(message, dict):
            raise BadInput(file, where, f"must be an object with 'role' and 'content', got {type_name(message)}", field=at)
        role = message.get("role")
        if role not in ROLES:
            raise BadInput(file, where, f"must be one of {', '.join(ROLES)}, got {role!r}", field=f"{at}.role")
        messages.append({"role": role, "content": text(message.get("content"), file, where, f"{at}.content")})
    return messages


def prompt_chat(value: Any, file: str, where: str, field: str) -> Messages:
    """A chat for the model to answer: it must end with the user's turn."""
    messages = chat(value, file, where, field)
    if messages[-1]["role"] != "user":
        raise BadInput(file, where, f"the last message must be the user's, got {messages[-1]['role']!r}", field=field)
    return messages


def text(value: Any, file: str, where: str, field: str) -> str:
    if value is None:
        raise BadInput(file, where, "is missing", field=field)
    if not isinstance(value, str):
        raise BadInput(file, where, f"must be text, got {type_name(value)}", field=field)
    if not value.strip():
        raise BadInput(file, where, "is empty", field=field)
    return value


def _decode(raw: bytes, file: str, where: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadInput(file, where, f"not valid UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})") from None


def type_name(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "text", bool: "true/false", int: "a number", float: "a number"}.get(
        type(value), type(value).__name__
    )
