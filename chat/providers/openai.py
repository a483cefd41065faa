"""The OpenAI-compatible Chat Completions adapter (OpenAI, DeepSeek, vLLM,
llama.cpp, Ollama: any base URL).

The SDK sends the request (auth, base URL, errors) with a client shared by
every turn to the endpoint (`clients`); the body's server-sent events are parsed
here into plain dicts, not into the SDK's objects (a pydantic model per chunk
cost most of a streamed token's CPU). Chunks are accumulated here too, not by
the SDK's `.stream()` helper: some servers repeat a tool call's id and name in
every fragment, and the first one must win rather than be concatenated.

Request rules: the neutral user message (tool results first, then text) is
split into `role: "tool"` messages and then a user message; arguments are JSON
with sorted keys; reasoning goes back as `reasoning_content` only where the
model's options say the server requires it (DeepSeek's thinking mode, on
assistant messages with tool calls). Files go as `image_url` parts with data URLs (and
PDFs as `file` parts, for a model listed as reading them) in the user message, a
tool's images in the user message after the tool messages (a tool message holds
text only); to a model that does not take them, as the text common.Files gives. A
user message with text only keeps plain string content.

SDK retries are off: retries belong to the turn engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx2
import openai

from chat.chunks import Role
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
    arguments_json,
    canonical,
    default_timeout,
    endpoint_key,
    json_loads,
    parse_arguments,
    read_body,
)
from chat.providers.registry import STREAM_IDLE_TIMEOUT, ModelInfo

logger = logging.getLogger(__name__)

NAME = "OpenAI-compatible server"
# finish_reason in the neutral (Anthropic) vocabulary that Finish uses.
STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}
# Where servers put reasoning text in a delta: DeepSeek and llama.cpp, then
# vLLM and Ollama.
REASONING_FIELDS = ("reasoning_content", "reasoning")
# Results of failed calls say so in their text: the wire format has no flag.
ERROR_PREFIX = "Error: "


class OpenAIProvider:
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
        return f"OpenAIProvider({self.model.id!r}, base_url={self.base_url!r})"

    def endpoint(self) -> tuple[Any, ...]:
        """The key of this provider's SDK client in the pool (see `clients`)."""
        return endpoint_key("openai", self.base_url, self.api_key, self.timeout)

    def client(self) -> openai.AsyncOpenAI:
        # Our own HTTP client, not the SDK's default one: that one closes itself
        # from the garbage collector on whatever loop runs then (see `clients`).
        return openai.AsyncOpenAI(
            api_key=self.api_key,
            base_url=self.base_url,
            timeout=self.timeout,
            max_retries=0,
            http_client=openai.DefaultAsyncHttpxClient(),
        )

    async def stream(self, request: Request) -> AsyncIterator[Event]:
        params = build_params(request, self.model)
        loop = asyncio.get_running_loop()
        self.alive_at = None
        client = None
        try:
            async with contextlib.AsyncExitStack() as stack:
                client = await stack.enter_async_context(CLIENTS.use(self.endpoint(), self.client))
                try:
                    response = await stack.enter_async_context(
                        client.chat.completions.with_streaming_response.create(
                            **params, stream=True
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
                for event in reader.end():
                    yield event
        except ProviderError as exc:
            # Where it happened, for the hint; and no key in what the page shows.
            effective = str(client.base_url) if client is not None else ""
            errors.located(
                exc, configured=self.base_url, effective=effective, secrets=(self.api_key,)
            )
            raise


class Reader:
    """A Chat Completions body, piece by piece, to neutral events: server-sent events
    parsed here into plain dicts, not into the SDK's objects (a pydantic model built
    per chunk was most of the CPU a streamed token cost)."""

    def __init__(self) -> None:
        self.sse = SSEDecoder()
        self.translator = Translator()
        # `data: [DONE]` came: the rest of the body means nothing.
        self.done = False

    def feed(self, piece: bytes) -> Iterator[Event]:
        try:
            for _, data in self.sse.feed(piece):
                if data.startswith("[DONE]"):
                    self.done = True
                    return
                yield from _read(self.translator.feed, _chunk(data))
        except (UnicodeDecodeError, SSEError) as exc:
            raise errors.bad_stream(NAME, f"malformed chunk in the stream ({exc})") from exc

    def end(self) -> list[Event]:
        """The events after the body: raises if the response is incomplete."""
        return _read(self.translator.end)


def _chunk(data: str) -> dict[str, Any]:
    """One chunk of the stream as JSON; `{"error": ...}` is the server's error."""
    try:
        chunk = json_loads(data)
    except ValueError as exc:
        raise errors.bad_stream(NAME, f"malformed chunk in the stream ({exc})") from exc
    if not isinstance(chunk, dict):
        raise errors.unexpected(NAME, "chunk", chunk)
    if error := chunk.get("error"):
        raise errors.in_stream(NAME, error)
    return chunk


def _read(step: Any, *args: Any) -> list[Event]:
    """One translator step; a failure of its own becomes the provider's error."""
    try:
        return step(*args)
    except ProviderError:
        raise
    except Exception as exc:
        logger.exception("%s: could not translate a stream chunk", NAME)
        raise errors.unreadable(NAME, exc) from exc


def classify(exc: BaseException) -> ProviderError:
    """The ProviderError for an exception of the SDK (sending the request) or of its
    HTTP client (reading the body)."""
    if isinstance(exc, ProviderError):
        return exc
    if isinstance(exc, openai.APIStatusError):
        return errors.from_status(NAME, exc.status_code, exc.body, exc.response.headers)
    if isinstance(exc, openai.APIConnectionError | httpx2.RequestError):
        # The SDK's error says only "Connection error."; the HTTP client's says what.
        return errors.transport(NAME, exc, timeout=isinstance(exc, openai.APITimeoutError))
    # Not a failure this module knows: still shown to the user as the
    # provider's, with the traceback in the log for whoever debugs it.
    logger.warning("unclassified %s failure", NAME, exc_info=exc)
    return ProviderError(f"{NAME}: unexpected {type(exc).__name__}: {exc}")


# --- Request -------------------------------------------------------------------


def build_params(request: Request, model: ModelInfo) -> dict[str, Any]:
    """The keyword arguments of `chat.completions.create` (without stream).

    No output limit is sent: OpenAI's newer models want max_completion_tokens,
    other servers max_tokens, and every one has a sane default.
    """
    messages: list[dict[str, Any]] = []
    files = Files(model, request.blobs)
    for message in request.messages:
        messages.extend(wire_messages(message, send_reasoning=model.send_reasoning, files=files))
    if not messages:
        raise ValueError("nothing to send: the request has no message with content")
    if request.system:
        messages.insert(0, {"role": "system", "content": request.system})
    params: dict[str, Any] = {
        "model": model.name,
        "messages": messages,
        "stream_options": {"include_usage": True},
    }
    tools = sorted(request.tools, key=lambda t: t.name)
    if tools:
        params["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description,
                    "parameters": canonical(t.input_schema),
                },
            }
            for t in tools
        ]
    return params


def wire_messages(
    message: Message, *, send_reasoning: bool = False, files: Files | None = None
) -> list[dict[str, Any]]:
    """One neutral message as Chat Completions messages (`files`: how the model is given
    images and PDFs; without it, each is a line of text)."""
    if message.role == Role.ASSISTANT:
        return [_assistant(message, send_reasoning)]
    files = files if files is not None else Files(None, None)
    out: list[dict[str, Any]] = []
    content: list[dict[str, Any]] = []
    for part in message.parts:
        if isinstance(part, ToolResultPart):
            result = part.result
            if part.is_error and not result.startswith(ERROR_PREFIX):
                result = ERROR_PREFIX + result
            out.append({"role": "tool", "tool_call_id": part.call_id, "content": result})
            content += [_file(image, files) for image in part.images]
        elif isinstance(part, TextPart) and part.text:
            content.append({"type": "text", "text": part.text})
        elif isinstance(part, ImagePart | DocumentPart):
            content.append(_file(part, files))
    if content and all(c["type"] == "text" for c in content):
        out.append({"role": "user", "content": "\n\n".join(c["text"] for c in content)})
    elif content:
        out.append({"role": "user", "content": content})
    return out


def _file(part: ImagePart | DocumentPart, files: Files) -> dict[str, Any]:
    data = files.encoded(part)
    if data is None:
        return {"type": "text", "text": files.instead(part)}
    url = f"data:{part.mime};base64,{data}"
    if isinstance(part, ImagePart):
        return {"type": "image_url", "image_url": {"url": url}}
    return {"type": "file", "file": {"filename": part.name, "file_data": url}}


def _assistant(message: Message, send_reasoning: bool) -> dict[str, Any]:
    texts = [p.text for p in message.parts if isinstance(p, TextPart) and p.text]
    calls = [p for p in message.parts if isinstance(p, ToolCallPart)]
    out: dict[str, Any] = {"role": "assistant", "content": "\n\n".join(texts) or None}
    if send_reasoning and calls:
        out["reasoning_content"] = "".join(
            p.text for p in message.parts if isinstance(p, ThinkingPart)
        )
    if calls:
        out["tool_calls"] = [
            {
                "id": c.call_id,
                "type": "function",
                "function": {"name": c.name, "arguments": arguments_json(c.arguments)},
            }
            for c in calls
        ]
    elif out["content"] is None:
        # Only reasoning was said: an assistant message needs content or calls.
        out["content"] = ""
    return out


# --- Response ------------------------------------------------------------------


class Translator:
    """Chat Completions chunks (parsed JSON) to neutral events.

    Tool calls are complete only at the end of the stream, so they are emitted
    there, in index order.
    """

    def __init__(self) -> None:
        self.calls: dict[int, dict[str, Any]] = {}
        self.reasoning = False
        self.finish_reason: str | None = None
        self.usage = Usage()

    def feed(self, chunk: dict[str, Any]) -> list[Event]:
        out: list[Event] = []
        usage = chunk.get("usage")
        if usage is not None:
            self.usage = _usage(usage)
        choices = chunk.get("choices")
        if not choices:
            return out
        if not isinstance(choices, list):
            raise errors.unexpected(NAME, "choices", choices)
        for i, choice in enumerate(choices):
            if not isinstance(choice, dict):
                raise errors.unexpected(NAME, f"choices[{i}]", choice)
            if choice.get("index", 0) not in (0, None):
                continue  # n > 1 is never asked for
            if reason := choice.get("finish_reason"):
                if not isinstance(reason, str):
                    raise errors.unexpected(NAME, "choices[0].finish_reason", reason)
                self.finish_reason = reason
            # Azure sends content-filter chunks with no delta at all.
            delta = choice.get("delta")
            if delta is not None:
                if not isinstance(delta, dict):
                    raise errors.unexpected(NAME, "choices[0].delta", delta)
                out += self._delta(delta)
        return out

    def end(self) -> list[Event]:
        """The events after the last chunk: pending reasoning end, calls, Finish."""
        if self.finish_reason is None:
            raise errors.incomplete(NAME)
        out = self._end_reasoning()
        stop = STOP_REASONS.get(self.finish_reason, self.finish_reason)
        calls: list[Event] = []
        for index in sorted(self.calls):
            call = self.calls[index]
            try:
                if not call["name"]:
                    raise ValueError("the call has no name")
                arguments = parse_arguments("".join(call["arguments"]))
            except ValueError as exc:
                if stop == "max_tokens":
                    # Cut off by the output limit: the call is dropped and the
                    # stop reason says why.
                    continue
                raise errors.bad_stream(
                    NAME, f"tool call #{index} ({call['name']}) is broken: {exc}"
                ) from exc
            calls.append(ToolCallEvent(call["id"] or f"call_{index}", call["name"], arguments))
        out += calls
        if calls and stop == "end_turn":
            # Some servers (Ollama) say "stop" even when they called tools. A
            # "length" stays: the output limit cut something off.
            stop = "tool_use"
        out.append(Finish(self.usage, stop))
        return out

    def _delta(self, delta: dict[str, Any]) -> list[Event]:
        out: list[Event] = []
        for name in REASONING_FIELDS:
            text = delta.get(name)
            if text is None:
                continue
            if not isinstance(text, str):
                raise errors.unexpected(NAME, f"choices[0].delta.{name}", text)
            if text:
                self.reasoning = True
                out.append(ReasoningDelta(text))
                break
        content = delta.get("content")
        if isinstance(content, str):
            if content:
                out += self._text(content)
        elif isinstance(content, list):
            # Typed parts (Mistral): text, and thinking holding text parts.
            for i, part in enumerate(content):
                out += self._part(part, f"choices[0].delta.content[{i}]")
        elif content is not None:
            raise errors.unexpected(NAME, "choices[0].delta.content", content)
        fragments = delta.get("tool_calls") or []
        if not isinstance(fragments, list):
            raise errors.unexpected(NAME, "choices[0].delta.tool_calls", fragments)
        for i, fragment in enumerate(fragments):
            out += self._end_reasoning()
            self._fragment(fragment, f"choices[0].delta.tool_calls[{i}]")
        return out

    def _text(self, text: str) -> list[Event]:
        return [*self._end_reasoning(), TextDelta(text)]

    def _part(self, part: Any, where: str) -> list[Event]:
        kind = _field(part, "type")
        if kind == "text":
            text = _field(part, "text")
            if not isinstance(text, str):
                raise errors.unexpected(NAME, f"{where}.text", text)
            return self._text(text) if text else []
        if kind == "thinking":
            thinking = _field(part, "thinking")
            if isinstance(thinking, str):
                text = thinking
            elif isinstance(thinking, list):
                texts = []
                for j, inner in enumerate(thinking):
                    inner_text = _field(inner, "text")
                    if _field(inner, "type") != "text" or not isinstance(inner_text, str):
                        raise errors.unexpected(NAME, f"{where}.thinking[{j}]", inner)
                    texts.append(inner_text)
                text = "".join(texts)
            else:
                raise errors.unexpected(NAME, f"{where}.thinking", thinking)
            if not text:
                return []
            self.reasoning = True
            return [ReasoningDelta(text)]
        raise errors.unexpected(NAME, where, part)

    def _end_reasoning(self) -> list[Event]:
        if not self.reasoning:
            return []
        self.reasoning = False
        return [ReasoningEnd()]

    def _fragment(self, fragment: Any, where: str) -> None:
        if not isinstance(fragment, dict):
            raise errors.unexpected(NAME, where, fragment)
        index = fragment.get("index")
        if index is not None and not isinstance(index, int):
            raise errors.unexpected(NAME, f"{where}.index", index)
        if index is None:
            index = len(self.calls)
        call = self.calls.setdefault(index, {"id": None, "name": None, "arguments": []})
        # The first id and name win: some servers repeat them in every fragment.
        if call["id"] is None and fragment.get("id"):
            call["id"] = fragment["id"]
        function = fragment.get("function")
        if function is None:
            return
        if not isinstance(function, dict):
            raise errors.unexpected(NAME, f"{where}.function", function)
        name = function.get("name")
        if name is not None and not isinstance(name, str):
            raise errors.unexpected(NAME, f"{where}.function.name", name)
        if call["name"] is None and name:
            call["name"] = name
        arguments = function.get("arguments")
        if arguments is not None and not isinstance(arguments, str):
            raise errors.unexpected(NAME, f"{where}.function.arguments", arguments)
        if arguments:
            call["arguments"].append(arguments)


def _field(value: Any, name: str) -> Any:
    """A field of a content part, or None when the part is not an object."""
    return value.get(name) if isinstance(value, dict) else None


def _usage(usage: Any) -> Usage:
    """Neutral usage: input_tokens excludes cache reads, as Anthropic counts it."""
    if not isinstance(usage, dict):
        raise errors.unexpected(NAME, "usage", usage)
    prompt = _int(usage.get("prompt_tokens", 0))
    completion = _int(usage.get("completion_tokens", 0))
    details = usage.get("prompt_tokens_details")
    cached = _int(details.get("cached_tokens", 0)) if isinstance(details, dict) else 0
    if not cached:
        # DeepSeek's own name for it.
        cached = _int(usage.get("prompt_cache_hit_tokens", 0))
    return Usage(
        input_tokens=max(prompt - cached, 0),
        output_tokens=completion,
        cache_read_tokens=cached,
    )


def _int(value: Any) -> int:
    return value if isinstance(value, int) else 0
