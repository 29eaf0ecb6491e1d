"""Reading prompt files (JSON Lines, CSV, Parquet, a `datasets` directory) into validated prompts.

A file is read and checked whole before anything is written, so one bad row stops the import
with a message naming the file, the row and the field.
"""

import hashlib
import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from store.db import BadInput
from store.input_files import ImportLimits, Messages, prompt_chat, read_rows, text

MAX_PROMPT_CHARS = 32_000
"""Longest prompt accepted, counting every message's text: longer ones are almost always a data error."""


@dataclass(frozen=True)
class NewPrompt:
    messages: Messages
    source: str
    tags: tuple[str, ...] = ()

    @cached_property
    def content_hash(self) -> str:
        """What makes two prompts the same: their messages, whatever the file or tags."""
        canonical = json.dumps(self.messages, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


def read_prompt_file(path: Path, limits: ImportLimits = ImportLimits()) -> list[NewPrompt]:
    """Every prompt in the file, or BadInput for the first bad row or a file over the limits."""
    return [_parse_row(row, str(path), where, path.name) for where, row in read_rows(path, limits)]


def _parse_row(row: dict[str, Any], file: str, where: str, source: str) -> NewPrompt:
    given = [key for key in ("prompt", "messages") if row.get(key) not in (None, "")]
    if len(given) == 2:
        raise BadInput(file, where, "give either 'prompt' or 'messages', not both", field="prompt")
    if not given:
        field = "messages" if "messages" in row and "prompt" not in row else "prompt"
        problem = "is empty" if field in row else "is missing: each row needs 'prompt' (text) or 'messages' (a chat list)"
        raise BadInput(file, where, problem, field=field)
    if given == ["prompt"]:
        messages = [{"role": "user", "content": text(row["prompt"], file, where, "prompt")}]
    else:
        messages = _messages(row["messages"], file, where)
    size = sum(len(m["content"]) for m in messages)
    if size > MAX_PROMPT_CHARS:
        raise BadInput(file, where, f"is {size:,} characters long; the limit is {MAX_PROMPT_CHARS:,}", field=given[0])
    return NewPrompt(messages=messages, source=source, tags=_tags(row.get("tags"), file, where))


def _messages(value: Any, file: str, where: str) -> Messages:
    if isinstance(value, str):  # CSV cells carry the chat list as JSON text
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise BadInput(file, where, f"is not a valid JSON chat list ({e.msg})", field="messages") from None
    return prompt_chat(value, file, where, "messages")


def _tags(value: Any, file: str, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = value.split(",")
    if not isinstance(value, list) or not all(isinstance(tag, str) for tag in value):
        raise BadInput(file, where, "must be a list of text tags or comma-separated text", field="tags")
    return tuple(tag.strip() for tag in value if tag.strip())
