"""Reading preference files (Anthropic HH transcripts, TRL's preference formats) into validated preferences.

Three row shapes, told apart by their fields:
- `prompt`, `chosen`, `rejected` (TRL, explicit prompt): text or chat lists;
- `chosen`, `rejected` as text (Anthropic HH): two "Human: ... Assistant: ..." transcripts that
  share every turn but the last reply;
- `chosen`, `rejected` as chat lists (TRL, implicit prompt): the messages both share are the prompt.

As with prompt files, the whole file is read and checked before anything is written, so one
bad row stops the import with a message naming the file, the row and the field.
"""

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from store.db import BadInput
from store.input_files import ImportLimits, Messages, chat, prompt_chat, read_rows, text, type_name
from store.prompt_files import MAX_PROMPT_CHARS, NewPrompt

_TURN = re.compile(r"\n\n(Human|Assistant):")
_ROLE = {"Human": "user", "Assistant": "assistant"}


@dataclass(frozen=True)
class NewPreference:
    prompt: NewPrompt
    chosen: str
    rejected: str

    @property
    def key(self) -> tuple[str, str, str]:
        """What makes two preferences the same: the prompt's content and both replies."""
        return self.prompt.content_hash, self.chosen, self.rejected


def read_preference_file(path: Path, limits: ImportLimits = ImportLimits()) -> list[NewPreference]:
    """Every preference in the file, or BadInput for the first bad row or a file over the limits."""
    return [_parse_row(row, str(path), where, path.name) for where, row in read_rows(path, limits)]


def _parse_row(row: dict[str, Any], file: str, where: str, source: str) -> NewPreference:
    for field in ("chosen", "rejected"):
        if row.get(field) is None:
            raise BadInput(file, where, "is missing: each row needs 'chosen' and 'rejected' (and may give 'prompt')", field=field)
    if row["chosen"] == row["rejected"]:
        raise BadInput(file, where, "is identical to 'chosen'", field="rejected")
    messages, chosen, rejected, prompt_field = _split(row, file, where)
    size = sum(len(m["content"]) for m in messages)
    if size > MAX_PROMPT_CHARS:
        raise BadInput(file, where, f"the prompt is {size:,} characters long; the limit is {MAX_PROMPT_CHARS:,}", field=prompt_field)
    for field, reply in (("chosen", chosen), ("rejected", rejected)):
        if len(reply) > MAX_PROMPT_CHARS:
            raise BadInput(file, where, f"the reply is {len(reply):,} characters long; the limit is {MAX_PROMPT_CHARS:,}", field=field)
    if chosen == rejected:
        raise BadInput(file, where, "gives the same reply as 'chosen'", field="rejected")
    return NewPreference(NewPrompt(messages=messages, source=source), chosen, rejected)


def _split(row: dict[str, Any], file: str, where: str) -> tuple[Messages, str, str, str]:
    """The prompt, the chosen and rejected replies, and the field the prompt came from."""
    chosen, rejected = row["chosen"], row["rejected"]
    if row.get("prompt") is not None:
        prompt = row["prompt"]
        if isinstance(prompt, str):
            messages = [{"role": "user", "content": text(prompt, file, where, "prompt")}]
        else:
            messages = prompt_chat(prompt, file, where, "prompt")
        return messages, _reply(chosen, file, where, "chosen"), _reply(rejected, file, where, "rejected"), "prompt"
    if isinstance(chosen, str) and isinstance(rejected, str):
        return *_transcripts(text(chosen, file, where, "chosen"), text(rejected, file, where, "rejected"), file, where), "chosen"
    if isinstance(chosen, list) and isinstance(rejected, list):
        return *_conversations(chosen, rejected, file, where), "chosen"
    for field, value in (("chosen", chosen), ("rejected", rejected)):
        if not isinstance(value, (str, list)):
            raise BadInput(file, where, f"must be a Human/Assistant transcript (text) or a chat list, got {type_name(value)}", field=field)
    raise BadInput(file, where, f"must be the same kind as 'chosen' (text or a chat list), got {type_name(rejected)}", field="rejected")


def _transcripts(chosen: str, rejected: str, file: str, where: str) -> tuple[Messages, str, str]:
    """Split two Anthropic HH transcripts into the prompt they share and their final replies.

    The prompt is every turn up to the last Human turn both share, and each reply is the rest of
    its transcript after the "Assistant:" that follows it. Cutting each transcript at its own
    last "Assistant:" would be wrong: a few HH replies hold turns the model made up
    ("... Human: Then how ...\\n\\nAssistant: I think ..."). TRL's HH conversion likewise takes the
    rest after the shared text as the reply (examples/datasets/hh-rlhf-helpful-base.py in TRL).
    """
    for field, transcript in (("chosen", chosen), ("rejected", rejected)):
        names = _TURN.findall(transcript)
        if not names or names[0] != "Human" or _TURN.split(transcript, maxsplit=1)[0].strip():
            raise BadInput(file, where, 'is not a Human/Assistant transcript: it must start with "\\n\\nHuman:"', field=field)
        if names[-1] != "Assistant":
            raise BadInput(file, where, "must end with an Assistant reply", field=field)
    turns = list(_TURN.finditer(chosen, 0, _common_prefix_length(chosen, rejected)))
    starts = [b for a, b in zip(turns, turns[1:]) if (a[1], b[1]) == ("Human", "Assistant")]
    replies = [t[starts[-1].end():] for t in (chosen, rejected)] if starts else []
    if not starts or any("\n\nHuman:" in reply for reply in replies):
        raise BadInput(
            file, where, "differs from 'chosen' before the final Assistant reply: the two must share every earlier turn", field="rejected"
        )
    parts = _TURN.split(chosen[: starts[-1].start()])
    messages = []
    for name, content in zip(parts[1::2], parts[2::2]):
        if not content.strip():
            raise BadInput(file, where, f"has an empty {name} turn", field="chosen")
        messages.append({"role": _ROLE[name], "content": content.strip()})
    # An empty final reply is data, not an error: HH records a reply the assistant left blank as
    # a bare "Assistant:", and annotators sometimes preferred it.
    return messages, replies[0].strip(), replies[1].strip()


def _common_prefix_length(a: Sequence, b: Sequence) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _conversations(chosen: list, rejected: list, file: str, where: str) -> tuple[Messages, str, str]:
    """Split two TRL chats (implicit prompt) into the messages they share and their final replies."""
    for field, value in (("chosen", chosen), ("rejected", rejected)):
        if not value:
            raise BadInput(file, where, "is empty", field=field)
    shared = _common_prefix_length(chosen, rejected)
    if shared == 0:
        raise BadInput(
            file, where, "shares no leading messages with 'chosen': with no 'prompt', the prompt is the messages both share", field="rejected"
        )
    for field, value in (("chosen", chosen), ("rejected", rejected)):
        if shared == len(value):
            raise BadInput(file, where, "has no reply after the messages it shares with the other", field=field)
    messages = chat(chosen[:shared], file, where, "chosen")
    if messages[-1]["role"] != "user":
        problem = f"the messages it shares with 'chosen' must end with the user's turn, got {messages[-1]['role']!r}"
        raise BadInput(file, where, problem, field="rejected")
    return messages, _reply(chosen[shared:], file, where, "chosen", shared), _reply(rejected[shared:], file, where, "rejected", shared)


def _reply(value: Any, file: str, where: str, field: str, first: int = 0) -> str:
    """A reply given as text, or as assistant messages (normally one; several are joined by a blank line).

    A message's content may be empty, unlike a blank field: TRL's conversion of HH keeps the
    replies the assistant left blank as "", and annotators sometimes preferred them.
    `first` is the index of value[0] in the row's list, for naming a bad message.
    """
    if isinstance(value, str):
        return text(value, file, where, field)
    if not isinstance(value, list) or not value:
        raise BadInput(file, where, f"must be text or a non-empty list of assistant messages, got {type_name(value)}", field=field)
    contents = []
    for i, message in enumerate(value, start=first):
        at = f"{field}[{i}]"
        if not isinstance(message, dict):
            raise BadInput(file, where, f"must be an object with 'role' and 'content', got {type_name(message)}", field=at)
        if message.get("role") != "assistant":
            problem = f"must be 'assistant': everything after the prompt is the reply, got {message.get('role')!r}"
            raise BadInput(file, where, problem, field=f"{at}.role")
        content = message.get("content")
        if not isinstance(content, str):
            problem = "is missing" if content is None else f"must be text, got {type_name(content)}"
            raise BadInput(file, where, problem, field=f"{at}.content")
        contents.append(content)
    return "\n\n".join(contents)
