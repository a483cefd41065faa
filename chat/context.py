"""Context-window management (ARCHITECTURE.md, Context management): how full a
tab's context is, when to compact it and through where, what the summary request
asks, which old tool outputs to elide.

Pure: no Django imports. The turn runner asks; history.py applies the answers
(it starts from the newest compaction chunk and sends elided results as one-line
sentinels).

Compaction happens in big steps at turn boundaries (above COMPACT_AT of the
window, down to COMPACT_TO), so the cache misses once per many turns, not every
step; a turn that overflows on its own (OVERFLOW_AT, or the provider refusing the
request as too long) keeps itself verbatim and has everything before it
summarised. Elision is applied only when the cache is cold anyway or together
with a compaction, never step by step: every change to an earlier message is a
cache miss of everything after it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, cast

from chat.chunks import Kind, Role, SystemKind, Thinking, ToolCall, ToolResult, UserText
from chat.providers.base import (
    DocumentPart,
    ImagePart,
    Message,
    ProviderError,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolResultPart,
    ToolSpec,
)
from chat.providers.registry import model_info
from chat.stream import ChunkLike

# A turn that would start with the context above this share of the window is
# preceded by a compaction...
COMPACT_AT = 0.75
# ... which keeps the most recent turns verbatim while they (and the summary) fit
# in this share, and summarises the rest.
COMPACT_TO = 0.25
# Within a turn: above this share the next step would risk the window, so
# everything before the turn is summarised (the turn itself stays verbatim).
OVERFLOW_AT = 0.90
# Room kept for the summary itself when choosing what stays verbatim.
SUMMARY_SHARE = 0.05
# Anthropic's ephemeral cache lives 5 minutes (OpenAI's automatic one 5 to 10):
# after a longer pause the next request writes the whole prefix anyway.
CACHE_LIFETIME = 300.0
# Tool results at least this long are "bulky": worth a sentinel once cold.
ELIDE_MIN_CHARS = 4_000
# The most recent turns whose results are never elided: the model is likely
# still working with them.
ELIDE_KEEP_TURNS = 2
# Eliding on a cold cache is worth it only when it removes at least this much
# (and the context is above COMPACT_TO): below that, the model loses more than
# the request saves.
ELIDE_MIN_TOTAL = 20_000
# The output limit of a summary request asked again after a refusal for the window
# (some models count input + max_tokens against it): room for a long summary.
SUMMARY_MAX_TOKENS = 16_000
# The rough rule for text: a token is about four characters (English and code).
CHARS_PER_TOKEN = 4
# Anthropic's rule for an image (width x height / 750 tokens), and about what a PDF
# page costs (its text and its picture): attachments weigh in the estimates.
IMAGE_PIXELS_PER_TOKEN = 750
PDF_PAGE_TOKENS = 2_000
# The window assumed for a model the registry does not know, per provider:
# every Claude model has at least 200k; OpenAI-compatible servers vary, and
# 128k is what the common ones offer. Said so on the meter.
UNKNOWN_WINDOWS = {"anthropic": 200_000}
UNKNOWN_WINDOW = 128_000

SUMMARY_HEADER = (
    "[This conversation was compacted to fit the context window. The summary "
    "below replaces the earlier messages.]\n\n"
)
ASK = (
    "Summarise this conversation so far for yourself: the summary will replace the "
    "messages above in your context, and the work continues from it. Keep the user's "
    "goals and requests, the decisions made and why, the state of the work (files "
    "changed, commands run and what they showed), what is still to do, and the facts "
    "you would otherwise have to look up again. Be concise but complete; plain text "
    "or Markdown. Do not call any tools: answer with the summary only."
)
ASK_AGAIN = "You called a tool, which cannot run now. Answer with the summary as text only."
KEPT_EXCERPT_CHARS = 120
# The system chunk kind naming tool results to send as sentinels.
ELIDE = SystemKind.ELIDE


@dataclass(frozen=True, slots=True)
class Size:
    """The tab's last request as the provider counted it (or an estimate)."""

    input: int = 0
    cache_read: int = 0
    cache_write: int = 0
    output: int = 0
    at: str = ""  # ISO time of the request
    estimated: bool = False

    @classmethod
    def from_dict(cls, raw: Any) -> Size:
        """Tab.context as stored; anything unreadable is "not known yet"."""
        if not isinstance(raw, dict):
            return cls()
        ints = {
            k: v
            for k in ("input", "cache_read", "cache_write", "output")
            if isinstance(v := raw.get(k), int) and not isinstance(v, bool) and v >= 0
        }
        at = raw.get("at")
        return cls(
            **ints, at=at if isinstance(at, str) else "", estimated=raw.get("estimated") is True
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def prompt(self) -> int:
        return self.input + self.cache_read + self.cache_write

    @property
    def next(self) -> int:
        """What the next request carries at least: this one and its answer."""
        return self.prompt + self.output

    @property
    def known(self) -> bool:
        return self.prompt > 0


def window(model: str) -> tuple[int, bool]:
    """The context window of model id `model`, and whether the registry knows it. A
    model id no provider serves gets the default too: its requests fail on their own."""
    try:
        info = model_info(model)
    except ValueError:
        return UNKNOWN_WINDOW, False
    if info.known:
        return info.context_window, True
    return UNKNOWN_WINDOWS.get(info.provider, UNKNOWN_WINDOW), False


@dataclass(frozen=True, slots=True)
class Meter:
    """What the status line shows: used / window, the cached share, where
    compaction will happen."""

    used: int
    window: int
    window_known: bool
    cached: float  # share of the last request read from the cache, 0..1
    compact_at: int
    estimated: bool

    @property
    def share(self) -> float:
        return min(self.used / self.window, 1.0) if self.window else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "share": round(self.share, 4)}


def meter(size: Size, model: str) -> Meter:
    win, known = window(model)
    cached = size.cache_read / size.prompt if size.prompt else 0.0
    return Meter(size.next, win, known, round(cached, 4), int(win * COMPACT_AT), size.estimated)


def due_at_turn_start(size: Size, win: int) -> bool:
    return size.next >= win * COMPACT_AT


def overflowing(size: Size, win: int) -> bool:
    return size.next >= win * OVERFLOW_AT


def cache_cold(size: Size, now: datetime) -> bool:
    """The cache has expired since the last request (or there was none)."""
    if not size.at:
        return True
    try:
        then = datetime.fromisoformat(size.at)
    except ValueError:
        return True
    return (now - then).total_seconds() > CACHE_LIFETIME


# Providers word a request over the window differently; each wording is a 400.
_OVERFLOW_WORDS = (
    "prompt is too long",  # Anthropic
    "exceed context limit",  # Anthropic: "input length and `max_tokens` exceed context limit"
    "exceed your context limit",
    "input is too long",
    "input length exceeds",
    "context_length_exceeded",  # OpenAI's code
    "maximum context length",  # OpenAI's message
    "context window",
    "too many tokens",
)


def is_overflow(error: ProviderError) -> bool:
    """A refusal because the request does not fit the model's context window."""
    if error.status_code not in (400, 413):
        return False
    text = f"{error.error_type or ''} {error.message}".lower()
    return any(word in text for word in _OVERFLOW_WORDS)


# --- Estimates -------------------------------------------------------------------


def part_chars(part: Any) -> int:
    match part:
        case TextPart(text=text):
            return len(text)
        case ThinkingPart(text=text, signature=signature, redacted_data=redacted):
            return len(text) + len(signature or "") // 4 + len(redacted or "")
        case ToolCallPart(name=name, arguments=arguments):
            return len(name) + len(json.dumps(arguments, ensure_ascii=False))
        case ToolResultPart(result=result):
            return len(result)
        case ImagePart(width=width, height=height):
            return _image_chars(width, height)
        case DocumentPart(pages=pages):
            return _pdf_chars(pages)
    return 0


def _image_chars(width: Any, height: Any) -> int:
    if not isinstance(width, int) or not isinstance(height, int):
        return 0
    return max(width * height, 0) // IMAGE_PIXELS_PER_TOKEN * CHARS_PER_TOKEN


def _pdf_chars(pages: Any) -> int:
    return max(pages, 1) * PDF_PAGE_TOKENS * CHARS_PER_TOKEN if isinstance(pages, int) else 0


def _attachment_chars(attachments: Any) -> int:
    """What a chunk's files add to a request (chat.blobs references)."""
    if not isinstance(attachments, list):
        return 0
    total = 0
    for ref in attachments:
        if not isinstance(ref, dict):
            continue
        if str(ref.get("mime", "")).startswith("image/"):
            total += _image_chars(ref.get("width"), ref.get("height"))
        else:
            total += _pdf_chars(ref.get("pages", 1))
    return total


def estimate(system: str, tools: Iterable[ToolSpec], messages: Iterable[Message]) -> int:
    """Tokens of a request by CHARS_PER_TOKEN: for the meter between a compaction
    and the next reported usage, never for billing."""
    chars = len(system)
    for spec in tools:
        chars += len(spec.name) + len(spec.description)
        chars += len(json.dumps(spec.input_schema, ensure_ascii=False))
    for message in messages:
        chars += sum(part_chars(p) for p in message.parts)
    return chars // CHARS_PER_TOKEN


def chunk_chars(chunk: ChunkLike) -> int:
    """What a chunk adds to a request, in characters (0 for what is never sent)."""
    match chunk.type:
        case Kind.TEXT:
            message = cast(UserText, chunk.data)
            return len(message.get("text") or "") + _attachment_chars(message.get("attachments"))
        case Kind.THINKING:
            return len(cast(Thinking, chunk.data).get("text") or "")
        case Kind.TOOL_CALL:
            arguments = cast(ToolCall, chunk.data).get("arguments") or {}
            return len(json.dumps(arguments, ensure_ascii=False)) + 20
        case Kind.TOOL_RESULT:
            data = cast(ToolResult, chunk.data)
            text = len(str(data.get("result") or "")) + len(str(data.get("shell_output") or ""))
            return text + _attachment_chars(data.get("attachments"))
    return 0


# --- Where to cut ----------------------------------------------------------------


def turns(chunks: Sequence[ChunkLike]) -> list[list[ChunkLike]]:
    """The chunks grouped by turn, in order (a turn's chunks are contiguous)."""
    groups: list[list[ChunkLike]] = []
    for chunk in chunks:
        if groups and groups[-1][0].turn_id == chunk.turn_id:
            groups[-1].append(chunk)
        else:
            groups.append([chunk])
    return groups


def plan_through(
    chunks: Sequence[ChunkLike], win: int, *, keep_current: bool = False
) -> int | None:
    """The seq a compaction summarises through, or None when there is nothing to
    summarise.

    `chunks` is what the request is built from now (after the newest compaction's
    `through_seq`, the compaction chunk itself included). The cut is always at a
    turn boundary. With `keep_current` (a turn overflowing on its own) the last
    turn stays verbatim and everything before it is summarised. Otherwise the
    most recent whole turns stay verbatim while they fit in COMPACT_TO of the
    window (less the summary's room), and the rest is summarised.
    """
    groups = [g for g in turns(chunks) if any(_sendable(c) for c in g)]
    if not groups:
        return None
    if keep_current:
        if len(groups) < 2:
            return None
        return _last_seq(groups[-2])
    budget = (win * (COMPACT_TO - SUMMARY_SHARE)) * CHARS_PER_TOKEN
    kept = 0
    through_index = len(groups) - 1  # keep nothing: summarise every turn
    for i in range(len(groups) - 1, 0, -1):
        kept += sum(chunk_chars(c) for c in groups[i])
        if kept > budget:
            break
        through_index = i - 1
    return _last_seq(groups[through_index])


def last_sendable(chunks: Sequence[ChunkLike]) -> int | None:
    """Through where a manual compaction of everything summarises: the view's last
    chunk, if anything in it is ever sent."""
    if not any(_sendable(c) for c in chunks):
        return None
    return _last_seq(list(chunks))


def turn_end(chunks: Sequence[ChunkLike], seq: int) -> int | None:
    """Through where "summarise up to here" at `seq` summarises: the end of that
    chunk's turn (a turn is never split), if it is in the view and something up
    to there is ever sent."""
    for group in turns(chunks):
        if group[0].seq is not None and group[0].seq <= seq <= _last_seq(group):
            end = _last_seq(group)
            if any(_sendable(c) for c in chunks if c.seq is not None and c.seq <= end):
                return end
            return None
    return None


def _last_seq(group: Sequence[ChunkLike]) -> int:
    seq = group[-1].seq
    if seq is None:
        raise ValueError("a chunk to compact has no seq")
    return seq


def _sendable(chunk: ChunkLike) -> bool:
    return chunk.role != Role.SYSTEM and chunk.type not in (Kind.ERROR, Kind.SYSTEM)


def ask(instructions: str = "", kept_from: str | None = None) -> str:
    """The user message appended to the live request to ask for the summary.

    `kept_from`: the beginning of the first message that stays verbatim after the
    summary (the model sees the whole conversation, so it is told where to stop).
    """
    text = ASK
    if kept_from is not None:
        excerpt = " ".join(kept_from.split())
        if len(excerpt) > KEPT_EXCERPT_CHARS:
            excerpt = excerpt[:KEPT_EXCERPT_CHARS] + "…"
        text += (
            f'\n\nThe conversation from the user\'s message that begins "{excerpt}" '
            "onward stays in your context word for word after the summary: summarise "
            "only what came before it."
        )
    if instructions.strip():
        text += f"\n\nFocus the summary on: {instructions.strip()}"
    return text


def kept_from(chunks: Sequence[ChunkLike], through: int) -> str | None:
    """The text of the first user message after `through` (None: nothing kept, or
    the kept part does not start with the user's words)."""
    for chunk in chunks:
        if chunk.seq is None or chunk.seq <= through or not _sendable(chunk):
            continue
        if chunk.role == Role.USER and chunk.type == Kind.TEXT:
            return str(cast(UserText, chunk.data).get("text") or "")
        return None
    return None


def summary_message(summary: str) -> str:
    return SUMMARY_HEADER + summary


# --- Truncation sentinels --------------------------------------------------------


def sentinel(name: str, chars: int) -> str:
    return f"[output of {name}, {chars:,} chars, removed to save context; re-run if needed]"


def plan_elision(chunks: Sequence[ChunkLike], elided: Iterable[int] = ()) -> list[int]:
    """Seqs of bulky tool results (ELIDE_MIN_CHARS or more) outside the last
    ELIDE_KEEP_TURNS turns that are not elided already, in order."""
    done = set(elided)
    groups = turns(chunks)
    old = groups[:-ELIDE_KEEP_TURNS] if len(groups) > ELIDE_KEEP_TURNS else []
    return [
        c.seq
        for group in old
        for c in group
        if c.type == Kind.TOOL_RESULT
        and c.seq is not None
        and c.seq not in done
        and "result" in c.data
        and chunk_chars(c) >= ELIDE_MIN_CHARS
    ]


def elided_chars(chunks: Sequence[ChunkLike], seqs: Iterable[int]) -> int:
    wanted = set(seqs)
    return sum(chunk_chars(c) for c in chunks if c.seq in wanted)
