"""The Anthropic Messages adapter: raw stream events in, provider-neutral events out.

Request rules (each one keeps the prefix byte-stable or the request valid):
- tools sorted by name, their schemas with sorted keys; the system prompt is sent
  as given (the caller freezes it per tab);
- thinking goes back exactly as it came (signature or redacted data), and
  thinking without either is dropped: Anthropic rejects it;
- files go as image and document blocks (base64 of the stored bytes, the same in
  every request) to a model that takes them, else as the line of text common.Files
  gives; a tool's images go inside its tool_result;
- cache breakpoints on the last tool, on the system prompt and on the last
  block of the request (moving), never on thinking or empty text: 3 of the 4
  the API allows. No breakpoint sits on an earlier message, so every message
  but the last goes out with the same bytes in every later request.

SDK retries are off: retries belong to the turn engine, which can tell the user.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import anthropic
import httpx2

from chat.providers import errors
from chat.providers.base import (
    DocumentPart,
    Event,
    Finish,
    ImagePart,
    Message,
    ProviderError,
    ReasoningDelta,
    ReasoningEnd,
    Request,
    TextDelta,
    TextPart,
    ThinkingPart,
    ToolCallEvent,
    ToolCallPart,
    ToolResultPart,
    Usage,
)
from chat.providers.clients import CLIENTS
from chat.providers.common import (
    Files,
    SSEDecoder,
    SSEError,
    canonical,
    default_timeout,
    endpoint_key,
    json_loads,
    parse_arguments,
    read_body,
)
from chat.providers.registry import MIN_THINKING_BUDGET, STREAM_IDLE_TIMEOUT, ModelInfo

logger = logging.getLogger(__name__)

NAME = "Anthropic"
EPHEMERAL = {"type": "ephemeral"}
# Blocks a breakpoint may sit on. Not thinking: the API refuses it there.
CACHEABLE = frozenset({"text", "tool_use", "tool_result", "image", "document"})


class AnthropicProvider:
    def __init__(
        self,
        model: ModelInfo,
        *,
        api_key: str,
        base_url: str | None = None,
        timeout: httpx2.Timeout | float | None = None,
        idle_timeout: float = STREAM_IDLE_TIMEOUT,
    ) -> None:
        self.model = model
        self.api_key = api_key
        self.base_url = base_url
        self.idle_timeout = idle_timeout
        # Loop time of the last bytes of the current stream (see base.Provider).
        self.alive_at: float | None = None
        self.timeout = timeout if timeout is not None else default_timeout(idle_timeout)

    def __repr__(self) -> str:
        return f"AnthropicProvider({self.model.id!r}, base_url={self.base_url!r})"

    def endpoint(self) -> tuple[Any, ...]:
        """The key of this provider's SDK client in the pool (see `clients`)."""
        return endpoint_key("anthropic", self.base_url, self.api_key, self.timeout)

    def client(self) -> anthropic.AsyncAnthropic:
        # Our own HTTP client, not the SDK's default one: that one closes itself
        # from the garbage collector on whatever loop runs then (see `clients`).
        return anthropic.AsyncAnthropic(
            api_key=self.api_key,
            base_url=self.base_url,
            timeout=self.timeout,
            max_retries=0,
            http_client=anthropic.DefaultAsyncHttpxClient(),
        )

    async def stream(self, request: Request) -> AsyncIterator[Event]:
        params = build_params(request, self.model)
        headers = {"anthropic-beta": ",".join(self.model.betas)} if self.model.betas else None
        loop = asyncio.get_running_loop()
        self.alive_at = None
        client = None
        try:
            async with contextlib.AsyncExitStack() as stack:
                client = await stack.enter_async_context(CLIENTS.use(self.endpoint(), self.client))
                try:
                    response = await stack.enter_async_context(
                        client.messages.with_streaming_response.create(
                            **params, stream=True, extra_headers=headers
                        )
                    )
                except Exception as exc:
                    raise classify(exc) from exc
                await errors.check_event_stream(NAME, response.http_response)
                reader = Reader()

                def seen() -> None:
                    self.alive_at = loop.time()

                events = read_body(response.http_response, reader, classify, seen)
                async with contextlib.aclosing(events):
                    async for event in events:
                        yield event
                yield reader.end()
        except ProviderError as exc:
            # Where it happened, for the hint; and no key in what the page shows.
            effective = str(client.base_url) if client is not None else ""
            errors.located(
                exc, configured=self.base_url, effective=effective, secrets=(self.api_key,)
            )
            raise


class Reader:
    """A Messages body, piece by piece, to neutral events: server-sent events parsed
    here into plain dicts, not into the SDK's objects."""

    def __init__(self) -> None:
        self.sse = SSEDecoder()
        self.translator = Translator()

    @property
    def done(self) -> bool:
        """The message is complete at message_stop: a body the server keeps open
        after it must not hold the answer back (nor the turn)."""
        return self.translator.stopped

    def feed(self, piece: bytes) -> Iterator[Event]:
        try:
            for name, data in self.sse.feed(piece):
                # As the SDK reads the stream: pings, nameless and empty events
                # carry nothing; `event: error` is the server's error.
                if name == "ping" or name is None:
                    continue
                if name == "error":
                    raise errors.in_stream(NAME, _error_body(data))
                if data:
                    yield from _read(self.translator.feed, _event(data))
                    if self.translator.stopped:
                        return  # what follows message_stop means nothing
        except (UnicodeDecodeError, SSEError) as exc:
            raise errors.bad_stream(NAME, f"malformed event in the stream ({exc})") from exc

    def end(self) -> Finish:
        """The Finish after the body: raises if the response is incomplete or broken."""
        if not self.translator.stopped:
            raise errors.incomplete(NAME)
        return _read(self.translator.finish)


def _event(data: str) -> dict[str, Any]:
    try:
        event = json_loads(data)
    except ValueError as exc:
        raise errors.bad_stream(NAME, f"malformed event in the stream ({exc})") from exc
    if not isinstance(event, dict):
        raise errors.unexpected(NAME, "event", event)
    return event


def _error_body(data: str) -> Any:
    """The body of an `event: error`: its JSON, or its text when it is not JSON."""
    try:
        return json_loads(data)
    except ValueError:
        return data


def _read(step: Any, *args: Any) -> Any:
    """One translator step; a failure of its own becomes the provider's error."""
    try:
        return step(*args)
    except ProviderError:
        raise
    except Exception as exc:
        logger.exception("%s: could not translate a stream event", NAME)
        raise errors.unreadable(NAME, exc) from exc


def classify(exc: BaseException) -> ProviderError:
    """The ProviderError for an exception of the SDK (sending the request) or of its
    HTTP client (reading the body)."""
    if isinstance(exc, ProviderError):
        return exc
    if isinstance(exc, anthropic.APIStatusError):
        return errors.from_status(NAME, exc.status_code, exc.body, exc.response.headers)
    if isinstance(exc, anthropic.APIConnectionError | httpx2.RequestError):
        # The SDK's error says only "Connection error."; the HTTP client's says what.
        return errors.transport(NAME, exc, timeout=isinstance(exc, anthropic.APITimeoutError))
    # Not a failure this module knows: still shown to the user as the
    # provider's, with the traceback in the log for whoever debugs it.
    logger.warning("unclassified %s failure", NAME, exc_info=exc)
    return ProviderError(f"{NAME}: unexpected {type(exc).__name__}: {exc}")


# --- Request -------------------------------------------------------------------


def build_params(request: Request, model: ModelInfo) -> dict[str, Any]:
    """The keyword arguments of `messages.create` for `request` (without stream)."""
    tools = [_tool(spec) for spec in sorted(request.tools, key=lambda t: t.name)]
    system = [{"type": "text", "text": request.system}] if request.system else []
    messages = wire_messages(request.messages, Files(model, request.blobs))
    if not messages:
        raise ValueError("nothing to send: the request has no message with content")
    mark_breakpoints(tools, system, messages)
    params: dict[str, Any] = {
        "model": model.name,
        "max_tokens": _max_tokens(request, model),
        "messages": messages,
    }
    if system:
        params["system"] = system
    if tools:
        params["tools"] = tools
    if model.thinking == "manual":
        params["thinking"] = {"type": "enabled", "budget_tokens": model.thinking_budget}
    elif model.thinking == "adaptive":
        params["thinking"] = {"type": "adaptive"}
    return params


def _max_tokens(request: Request, model: ModelInfo) -> int:
    """The model's output limit, or the request's lower one; never at or below a
    manual thinking budget, which the API wants below it (without interleaving)."""
    if request.max_tokens is None:
        return model.max_output
    floor = model.thinking_budget + MIN_THINKING_BUDGET if model.thinking == "manual" else 1
    return min(model.max_output, max(request.max_tokens, floor))


def _tool(spec: Any) -> dict[str, Any]:
    tool: dict[str, Any] = {"name": spec.name}
    if spec.description:
        tool["description"] = spec.description
    tool["input_schema"] = canonical(spec.input_schema)
    return tool


def wire_messages(messages: Sequence[Message], files: Files | None = None) -> list[dict[str, Any]]:
    """Neutral messages as Anthropic message params (`files`: how the model is given
    images and PDFs; without it, each is a line of text).

    A message left with no block (only unsigned thinking, say) is dropped and
    its neighbours of one role are merged: the API wants non-empty messages
    with alternating roles.
    """
    files = files if files is not None else Files(None, None)
    out: list[dict[str, Any]] = []
    for message in messages:
        blocks = [b for b in (_block(part, files) for part in message.parts) if b is not None]
        if not blocks:
            continue
        if out and out[-1]["role"] == message.role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": message.role, "content": blocks})
    return out


def _block(part: Any, files: Files) -> dict[str, Any] | None:
    match part:
        case TextPart(text=text):
            return {"type": "text", "text": text} if text else None
        case ThinkingPart(text=text, signature=signature, redacted_data=redacted):
            if redacted:
                return {"type": "redacted_thinking", "data": redacted}
            if signature:
                return {"type": "thinking", "thinking": text, "signature": signature}
            return None  # reasoning of another provider, or cut off before its signature
        case ToolCallPart(call_id=call_id, name=name, arguments=arguments):
            return {"type": "tool_use", "id": call_id, "name": name, "input": canonical(arguments)}
        case ToolResultPart(call_id=call_id, result=result, is_error=is_error, images=images):
            block: dict[str, Any] = {"type": "tool_result", "tool_use_id": call_id}
            if images:
                content = [{"type": "text", "text": result}] if result else []
                block["content"] = content + [_file(image, files) for image in images]
            elif result:
                block["content"] = result
            if is_error:
                block["is_error"] = True
            return block
        case ImagePart() | DocumentPart():
            return _file(part, files)
    raise TypeError(f"not a request part: {part!r}")


def _file(part: ImagePart | DocumentPart, files: Files) -> dict[str, Any]:
    data = files.encoded(part)
    if data is None:
        return {"type": "text", "text": files.instead(part)}
    source = {"type": "base64", "media_type": part.mime, "data": data}
    if isinstance(part, ImagePart):
        return {"type": "image", "source": source}
    return {"type": "document", "source": source, "title": part.name}


def mark_breakpoints(
    tools: list[dict[str, Any]], system: list[dict[str, Any]], messages: list[dict[str, Any]]
) -> None:
    """Add cache_control to the blocks that end a reusable prefix.

    Three at most (the API accepts four). The fixed ones (last tool, system) are
    shared by every request of a tab;
    the moving one on the last block writes this request's prefix, which the
    next request reads by looking back from its own last block. (A read looks
    back at most 20 blocks: a step adding more than that misses once. A
    breakpoint on the previous request's tail would fix that, but would also
    change the bytes of an earlier message between requests.)
    """
    marks: list[dict[str, Any]] = []
    if tools:
        marks.append(tools[-1])
    if system:
        marks.append(system[-1])
    tail = _last_cacheable(messages)
    if tail is not None:
        marks.append(tail)
    for block in marks:
        block["cache_control"] = dict(EPHEMERAL)


def _last_cacheable(messages: list[dict[str, Any]]) -> dict[str, Any] | None:
    for message in reversed(messages):
        for block in reversed(message["content"]):
            if block["type"] in CACHEABLE:
                return block
    return None


# --- Response ------------------------------------------------------------------


class Translator:
    """Raw stream events (parsed JSON, dispatched on their `type`) to neutral events."""

    def __init__(self) -> None:
        self.blocks: dict[int, dict[str, Any]] = {}
        self.usage: dict[str, int] = {}
        self.stop_reason: str | None = None
        self.stopped = False
        # A tool call whose arguments are not JSON. When the response was cut
        # at max_tokens the call is dropped and the stop reason says why;
        # otherwise the stream is broken.
        self.broken: ProviderError | None = None

    def feed(self, raw: dict[str, Any]) -> list[Event]:
        kind = raw.get("type")
        if kind == "content_block_delta":
            return self._delta(_index(raw), _object(raw.get("delta"), f"{kind}.delta"))
        if kind == "message_start":
            message = _object(raw.get("message"), "message_start.message")
            self._usage(message.get("usage"))
            return self._prefilled(message.get("content"))
        if kind == "content_block_start":
            block = _object(raw.get("content_block"), "content_block_start.content_block")
            return self._start(_index(raw), block)
        elif kind == "content_block_stop":
            return self._stop(_index(raw))
        elif kind == "message_delta":
            delta = _object(raw.get("delta"), "message_delta.delta")
            self.stop_reason = delta.get("stop_reason") or self.stop_reason
            self._usage(raw.get("usage"))
        elif kind == "message_stop":
            self.stopped = True
        # ping and event types added later: nothing to do.
        return []

    def finish(self) -> Finish:
        """The Finish of a complete stream; raises if a tool call was broken."""
        if self.broken is not None and self.stop_reason != "max_tokens":
            raise self.broken
        u = self.usage
        return Finish(
            Usage(
                input_tokens=u.get("input_tokens", 0),
                output_tokens=u.get("output_tokens", 0),
                cache_read_tokens=u.get("cache_read_input_tokens", 0),
                cache_write_tokens=u.get("cache_creation_input_tokens", 0),
            ),
            self.stop_reason or "end_turn",
        )

    def _usage(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        # message_delta usage is cumulative, and may omit what message_start had.
        for name in (
            "input_tokens",
            "output_tokens",
            "cache_read_input_tokens",
            "cache_creation_input_tokens",
        ):
            value = usage.get(name)
            if isinstance(value, int):
                self.usage[name] = value

    def _prefilled(self, content: Any) -> list[Event]:
        """Blocks that came whole in message_start: each as if streamed (started
        and stopped at once). They take keys below 0, which no streamed block's
        index uses."""
        if not content:
            return []
        if not isinstance(content, list):
            raise errors.unexpected(NAME, "message_start.message.content", content)
        out: list[Event] = []
        for i, block in enumerate(content):
            key = -1 - i
            where = f"message_start.message.content[{i}]"
            out += self._start(key, _object(block, where), where)
            out += self._stop(key)
        return out

    def _start(
        self, index: int, block: dict[str, Any], where: str = "content_block_start"
    ) -> list[Event]:
        kind = block.get("type")
        if kind == "text":
            self.blocks[index] = {"type": "text"}
            text = _string(block.get("text"), f"{where}.text")
            return [TextDelta(text)] if text else []
        if kind == "thinking":
            signature = _string(block.get("signature"), f"{where}.signature")
            self.blocks[index] = {"type": "thinking", "signature": signature}
            text = _string(block.get("thinking"), f"{where}.thinking")
            return [ReasoningDelta(text)] if text else []
        if kind == "redacted_thinking":
            # Arrives whole; no deltas follow.
            data = block.get("data")
            if not isinstance(data, str) or not data:
                raise errors.unexpected(NAME, f"{where}.data", data)
            return [ReasoningEnd(redacted_data=data)]
        if kind == "tool_use":
            call_id = block.get("id")
            name = block.get("name")
            arguments = block.get("input") or {}
            if not isinstance(call_id, str) or not call_id:
                raise errors.unexpected(NAME, f"{where}.id", call_id)
            if not isinstance(name, str) or not name:
                raise errors.unexpected(NAME, f"{where}.name", name)
            if not isinstance(arguments, dict):
                raise errors.unexpected(NAME, f"{where}.input", arguments)
            self.blocks[index] = {
                "type": "tool_use",
                "id": call_id,
                "name": name,
                "input": arguments,
                "json": [],
            }
        # Server tools and their results run at Anthropic and are not ours.
        return []

    def _delta(self, index: int, delta: dict[str, Any]) -> list[Event]:
        block = self.blocks.get(index)
        if block is None:
            return []
        kind = delta.get("type")
        where = "content_block_delta.delta"
        if kind == "text_delta":
            text = _string(delta.get("text"), f"{where}.text")
            return [TextDelta(text)] if text else []
        if kind == "thinking_delta":
            text = _string(delta.get("thinking"), f"{where}.thinking")
            return [ReasoningDelta(text)] if text else []
        if kind == "signature_delta":
            signature = _string(delta.get("signature"), f"{where}.signature")
            block["signature"] = (block.get("signature") or "") + signature
        elif kind == "input_json_delta" and block["type"] == "tool_use":
            block["json"].append(_string(delta.get("partial_json"), f"{where}.partial_json"))
        return []

    def _stop(self, index: int) -> list[Event]:
        block = self.blocks.pop(index, None)
        if block is None:
            return []
        if block["type"] == "thinking":
            return [ReasoningEnd(signature=block["signature"] or None)]
        if block["type"] == "tool_use":
            raw = "".join(block["json"])
            try:
                arguments = parse_arguments(raw) if raw else dict(block["input"])
            except ValueError as exc:
                self.broken = errors.bad_stream(
                    NAME, f"the arguments of tool call {block['name']} are not JSON ({exc})"
                )
                return []
            return [ToolCallEvent(block["id"], block["name"], arguments)]
        return []


def _string(value: Any, where: str) -> str:
    """A text field of the stream: a string, or absent ("")."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise errors.unexpected(NAME, where, value)
    return value


def _object(value: Any, where: str) -> dict[str, Any]:
    """A field of the stream that holds an object."""
    if not isinstance(value, dict):
        raise errors.unexpected(NAME, where, value)
    return value


def _index(raw: dict[str, Any]) -> int:
    """The block index of a content_block_* event."""
    index = raw.get("index")
    if not isinstance(index, int):
        raise errors.unexpected(NAME, f"{raw.get('type')}.index", index)
    return index
