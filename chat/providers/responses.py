"""The OpenAI Responses adapter (`POST /responses`): reasoning kept between steps.

Chat Completions never returns a reasoning model's reasoning, so each step of a
tool-using turn starts its thinking again. The Responses API returns it as reasoning
items (encrypted: `include: ["reasoning.encrypted_content"]`, since nothing is stored
at OpenAI, `store: false`), which go back in the next request as they came.

The SDK sends the request (auth, base URL, errors) with the client every turn to the
endpoint shares (`clients`); the body is read by common.SSEDecoder into plain dicts,
one event at a time by its `type`, not by the SDK's `responses.stream()` helper (which
raises on an incomplete response). A stream need not begin with `response.created`
and ends with `response.completed`, `response.incomplete` or `response.failed`, no
`[DONE]`.

Request rules (each keeps the prefix byte-stable or the request valid):
- the system prompt is `instructions`, not a developer message: it is the API's own
  place for it, it stays out of `input` (so `input` is the log's items and nothing
  else, one list that only grows), and the summary request of a compaction, which
  appends one user message, keeps it unchanged;
- every earlier reasoning item is sent as it came (its JSON text from the log, key
  order included: its `id` and `encrypted_content` are final only in
  `response.output_item.done`), except one that nothing follows in its message (the
  API refuses it); reasoning of another provider (no item) is left out;
- `function_call` and `function_call_output` items in log order; arguments as JSON
  with sorted keys; a failed call's output starts with "Error: ";
- images and PDFs as `input_image` / `input_file` parts (data URLs of the stored
  bytes, the same in every request) to a model that takes them, else common.Files'
  line of text; a tool's images in its output, as parts after its text;
- tools sorted by name, schemas with sorted keys, `strict: false` (the API's default
  is strict, which wants every property required);
- `prompt_cache_key` is the tab's id (Request.cache_key): every request of a tab is
  routed to the same cache, which a prefix shared by every tab (system prompt and
  tools) would otherwise spread over many.

SDK retries are off: retries belong to the turn engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
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

NAME = "OpenAI (Responses API)"
# Results of failed calls say so in their text: the wire format has no flag.
ERROR_PREFIX = "Error: "
# What a refusal's text starts with in the log: it is the model's answer, and the
# page and the model's next request must not take it for an ordinary one.
REFUSAL_MARK = "[Refusal] "
# Between two summary parts of one reasoning item: each is a paragraph of its own.
SUMMARY_BREAK = "\n\n"
INCLUDE = ["reasoning.encrypted_content"]
# OpenAI's reasoning models, when the registry does not say so (a model it does not
# list): only they accept `reasoning` and encrypted reasoning content.
# gpt-5-chat-latest is ChatGPT's model without reasoning: it refuses `reasoning`.
REASONING_NAMES = re.compile(r"^(o\d|gpt-5(?!-chat)|codex)")
# The events that end a response.
TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})
# Events that carry nothing a turn shows or sends back: known, so not logged.
QUIET = frozenset(
    {
        "response.created",
        "response.in_progress",
        "response.queued",
        "response.content_part.added",
        "response.content_part.done",
        "response.output_text.done",
        "response.output_text.annotation.added",
        "response.refusal.done",
        "response.reasoning_summary_part.done",
        "response.reasoning_summary_text.done",
        "response.reasoning_text.done",
        "keepalive",
    }
)
# Error codes of response.failed / error events: the HTTP status each stands for (the
# UI and the retry policy reason in statuses), and those a retry may cure. A quota
# error is not retried: waiting does not add credit, and the card says what to do.
STATUS_OF_CODE = {
    "server_error": 500,
    "rate_limit_exceeded": 429,
    "insufficient_quota": 429,
    "vector_store_timeout": 504,
    "invalid_prompt": 400,
    "context_length_exceeded": 400,
}
RETRYABLE_CODES = frozenset({"server_error", "rate_limit_exceeded", "vector_store_timeout"})
# Finish's stop reasons (the Anthropic vocabulary) for response.incomplete's reason.
INCOMPLETE_REASONS = {"max_output_tokens": "max_tokens", "content_filter": "refusal"}


# Endpoints (by endpoint key) that refused reasoning summaries: OpenAI answers 400
# (param `reasoning.summary`) to an organisation it has not verified. Their requests leave
# `summary` out from then on (reasoning is still kept between steps, only not shown), so a
# tab's later requests keep one shape and their shared prefix.
_NO_SUMMARY: set[tuple[Any, ...]] = set()


def is_reasoning(model: ModelInfo) -> bool:
    return model.thinking != "none" or bool(REASONING_NAMES.match(model.name))


class ResponsesProvider:
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
        return f"ResponsesProvider({self.model.id!r}, base_url={self.base_url!r})"

    def endpoint(self) -> tuple[Any, ...]:
        """The key of this provider's SDK client in the pool: the Chat Completions
        adapter's own, as it is the same client."""
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
        if self.endpoint() in _NO_SUMMARY:
            params.pop("reasoning", None)
        try:
            async for event in self._stream(params):
                yield event
        except ProviderError as exc:
            if "reasoning" not in params or not _refuses_summary(exc):
                raise
            logger.warning("%s refuses reasoning summaries: asking without them", self.base_url)
            _NO_SUMMARY.add(self.endpoint())
            params.pop("reasoning")
            async for event in self._stream(params):
                yield event

    async def _stream(self, params: dict[str, Any]) -> AsyncIterator[Event]:
        loop = asyncio.get_running_loop()
        self.alive_at = None
        client = None
        try:
            async with contextlib.AsyncExitStack() as stack:
                client = await stack.enter_async_context(CLIENTS.use(self.endpoint(), self.client))
                try:
                    response = await stack.enter_async_context(
                        client.responses.with_streaming_response.create(**params, stream=True)
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


def _refuses_summary(exc: ProviderError) -> bool:
    """A 400 that refuses `reasoning.summary` (before anything streamed): e.g. "Your
    organization must be verified to generate reasoning summaries"."""
    return exc.status_code == 400 and (
        "reasoning.summary" in exc.message or "reasoning summar" in exc.message.lower()
    )


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
    if isinstance(exc, openai.APIError):
        # The bare APIError the SDK raises for an `error` event when it reads the stream
        # itself: the same words as the event read here.
        body = exc.body if isinstance(exc.body, dict) else {"message": exc.message}
        return failure(body, "error")
    logger.warning("unclassified %s failure", NAME, exc_info=exc)
    return ProviderError(f"{NAME}: unexpected {type(exc).__name__}: {exc}")


# --- Request -------------------------------------------------------------------


def build_params(request: Request, model: ModelInfo) -> dict[str, Any]:
    """The keyword arguments of `responses.create` (without stream)."""
    files = Files(model, request.blobs)
    items: list[dict[str, Any]] = []
    for message in request.messages:
        items.extend(input_items(message, files))
    if not items:
        raise ValueError("nothing to send: the request has no message with content")
    params: dict[str, Any] = {"model": model.name}
    if request.system:
        params["instructions"] = request.system
    params["input"] = items
    tools = sorted(request.tools, key=lambda t: t.name)
    if tools:
        params["tools"] = [
            {
                "type": "function",
                "name": t.name,
                "description": t.description,
                "parameters": canonical(t.input_schema),
                "strict": False,
            }
            for t in tools
        ]
    params["store"] = False
    if is_reasoning(model):
        params["include"] = list(INCLUDE)
        params["reasoning"] = {"summary": "auto"}
    if request.max_tokens is not None:
        params["max_output_tokens"] = min(request.max_tokens, model.max_output)
    if request.cache_key:
        params["prompt_cache_key"] = request.cache_key
    return params


def input_items(message: Message, files: Files | None = None) -> list[dict[str, Any]]:
    """One neutral message as Responses input items, in its parts' order."""
    files = files if files is not None else Files(None, None)
    if message.role == Role.ASSISTANT:
        items = [item for part in message.parts if (item := _assistant_item(part)) is not None]
        # The API refuses a reasoning item with nothing after it (a turn stopped right
        # after the reasoning, an answer of reasoning only): that reasoning is left out.
        # A message is sent only once it is whole, so this never changes sent bytes.
        while items and items[-1].get("type") == "reasoning":
            items.pop()
        return items
    out: list[dict[str, Any]] = []
    content: list[dict[str, Any]] = []
    for part in message.parts:
        if isinstance(part, ToolResultPart):
            out.append(_call_output(part, files))
        elif isinstance(part, TextPart) and part.text:
            content.append({"type": "input_text", "text": part.text})
        elif isinstance(part, ImagePart | DocumentPart):
            content.append(_file(part, files))
    if content and all(c["type"] == "input_text" for c in content):
        out.append({"role": "user", "content": "\n\n".join(c["text"] for c in content)})
    elif content:
        out.append({"role": "user", "content": content})
    return out


def _assistant_item(part: Any) -> dict[str, Any] | None:
    match part:
        case ThinkingPart(reasoning_item=item):
            return _reasoning(item) if item else None
        case TextPart(text=text):
            return {"role": "assistant", "content": text} if text else None
        case ToolCallPart(call_id=call_id, name=name, arguments=arguments):
            return {
                "type": "function_call",
                "call_id": call_id,
                "name": name,
                "arguments": arguments_json(arguments),
            }
    raise TypeError(f"not an assistant part: {part!r}")


def _reasoning(text: str) -> dict[str, Any] | None:
    """The reasoning item as it came: its JSON text parsed into a dict that keeps the
    key order, which the SDK writes back as it is. One that is not a reasoning object
    (an edited import) cannot be sent, and is left out with a log line."""
    try:
        item = json_loads(text)
    except ValueError:
        item = None
    if not isinstance(item, dict) or item.get("type") != "reasoning":
        logger.warning("%s: a stored reasoning item is not one, left out: %.80r", NAME, text)
        return None
    return item


def _call_output(part: ToolResultPart, files: Files) -> dict[str, Any]:
    result = part.result
    if part.is_error and not result.startswith(ERROR_PREFIX):
        result = ERROR_PREFIX + result
    output: Any = result
    if part.images:
        output = [{"type": "input_text", "text": result}]
        output += [_file(image, files) for image in part.images]
    return {"type": "function_call_output", "call_id": part.call_id, "output": output}


def _file(part: ImagePart | DocumentPart, files: Files) -> dict[str, Any]:
    data = files.encoded(part)
    if data is None:
        return {"type": "input_text", "text": files.instead(part)}
    url = f"data:{part.mime};base64,{data}"
    if isinstance(part, ImagePart):
        return {"type": "input_image", "image_url": url, "detail": "auto"}
    return {"type": "input_file", "filename": part.name, "file_data": url}


# --- Response ------------------------------------------------------------------


class Reader:
    """A Responses body, piece by piece, to neutral events (see the module docstring)."""

    def __init__(self) -> None:
        self.sse = SSEDecoder()
        self.translator = Translator()

    @property
    def done(self) -> bool:
        """A terminal event came: the response is complete (or failed)."""
        return self.translator.finish is not None

    def feed(self, piece: bytes) -> Iterator[Event]:
        try:
            for name, data in self.sse.feed(piece):
                if not data.strip():
                    continue
                yield from _read(self.translator.feed, _event(name, data))
                if self.done:
                    return  # what follows the end means nothing
        except (UnicodeDecodeError, SSEError) as exc:
            raise errors.bad_stream(NAME, f"malformed event in the stream ({exc})") from exc

    def end(self) -> list[Event]:
        """The events after the body: raises if the response is incomplete."""
        finish = self.translator.finish
        if finish is None:
            raise errors.incomplete(NAME)
        return [finish]


def _event(name: str | None, data: str) -> dict[str, Any]:
    """One event as JSON, its `type` from its data (else from its SSE name)."""
    try:
        event = json_loads(data)
    except ValueError as exc:
        raise errors.bad_stream(NAME, f"malformed event in the stream ({exc})") from exc
    if not isinstance(event, dict):
        raise errors.unexpected(NAME, "event", event)
    if "type" not in event and name:
        event = {"type": name, **event}
    if not isinstance(event.get("type"), str):
        raise errors.unexpected(NAME, "event.type", event.get("type"))
    return event


def _read(step: Any, *args: Any) -> Any:
    """One translator step; a failure of its own becomes the provider's error."""
    try:
        return step(*args)
    except ProviderError:
        raise
    except Exception as exc:
        logger.exception("%s: could not translate a stream event", NAME)
        raise errors.unreadable(NAME, exc) from exc


def failure(body: Any, where: str) -> ProviderError:
    """The error of a `response.failed` (its response's `error`) or an `error` event (its
    own `code` and `message`, or those nested under `error`): the provider's message
    and code, retryable as the code says."""
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        body = body["error"]
    elif isinstance(body, dict) and body.get("type") == "error":
        # The event itself: its `type` names the event, not the error.
        body = {k: v for k, v in body.items() if k != "type"}
    if not isinstance(body, dict):
        raise errors.unexpected(NAME, where, body)
    code = body.get("code") or body.get("type")
    code = str(code) if code is not None else None
    message = body.get("message")
    text = f"{NAME} error"
    if code:
        text += f" ({code})"
    text += f": {message}" if message else ": the response failed"
    # Unnamed errors mid-stream are almost always the server's trouble.
    retryable = code is None or code in RETRYABLE_CODES or code in errors.RETRYABLE_TYPES
    status = STATUS_OF_CODE.get(code or "") or errors.STATUS_OF_TYPE.get(code or "")
    return ProviderError(text, status_code=status, error_type=code, retryable=retryable)


class Translator:
    """Responses stream events (parsed JSON, dispatched on their `type`) to neutral events.

    Output items are streamed one after another, each by its `output_index`: reasoning
    (summary deltas as thinking, closed by the item's final JSON), messages (text, or
    a refusal marked as one), function calls (emitted whole at their item's end, so
    parallel calls come out in the order the model made them).
    """

    def __init__(self) -> None:
        # Per output_index: what the item is, and what it gathered.
        self.items: dict[int, dict[str, Any]] = {}
        self.calls = 0
        self.refused = False
        # A call whose arguments are not JSON: an error unless the output limit cut it.
        self.broken: ProviderError | None = None
        self.finish: Finish | None = None
        self.unknown: set[str] = set()

    def feed(self, event: dict[str, Any]) -> list[Event]:
        kind: str = event["type"]
        handler = _HANDLERS.get(kind)
        if handler is not None:
            return handler(self, event)
        if kind not in QUIET and kind not in self.unknown:
            # A later version of the API may add events: what it adds is not shown.
            self.unknown.add(kind)
            logger.info("%s: ignoring an event of unknown type %r", NAME, kind)
        return []

    # --- items ---

    def _added(self, event: dict[str, Any]) -> list[Event]:
        item = _object(event.get("item"), "response.output_item.added.item")
        index = _index(event)
        kind = item.get("type")
        state: dict[str, Any] = {"type": kind, "parts": set(), "text": False}
        if kind == "function_call":
            state["call_id"] = item.get("call_id")
            state["name"] = item.get("name")
            state["arguments"] = [_string(item.get("arguments"), "item.arguments")]
        self.items[index] = state
        return []

    def _done(self, event: dict[str, Any]) -> list[Event]:
        item = _object(event.get("item"), "response.output_item.done.item")
        state = self.items.pop(_index(event), {})
        kind = item.get("type")
        if kind == "reasoning":
            # Final only here: the id and encrypted content of .added may differ.
            text = json.dumps(item, ensure_ascii=False, separators=(",", ":"))
            return [*self._whole_summary(item, state), ReasoningEnd(reasoning_item=text)]
        if kind == "function_call":
            return self._call(item, state)
        if kind == "message" and not state.get("text"):
            # A server that sends a message whole, with no deltas.
            return self._whole_message(item)
        return []

    def _call(self, item: dict[str, Any], state: dict[str, Any]) -> list[Event]:
        call_id = item.get("call_id") or state.get("call_id")
        name = item.get("name") or state.get("name")
        raw = item.get("arguments")
        if raw is None:
            raw = "".join(state.get("arguments") or [])
        where = "response.output_item.done.item"
        if not isinstance(call_id, str) or not call_id:
            raise errors.unexpected(NAME, f"{where}.call_id", call_id)
        if not isinstance(name, str) or not name:
            raise errors.unexpected(NAME, f"{where}.name", name)
        try:
            arguments = parse_arguments(_string(raw, f"{where}.arguments"))
        except ValueError as exc:
            self.broken = errors.bad_stream(
                NAME, f"the arguments of tool call {name} are not JSON ({exc})"
            )
            return []
        self.calls += 1
        return [ToolCallEvent(call_id, name, arguments)]

    def _whole_summary(self, item: dict[str, Any], state: dict[str, Any]) -> list[Event]:
        """A summary that came whole in the item, with no deltas (some servers)."""
        summary = item.get("summary")
        if state.get("streamed") or not isinstance(summary, list):
            return []
        texts = [p.get("text") for p in summary if isinstance(p, dict)]
        text = SUMMARY_BREAK.join(t for t in texts if isinstance(t, str) and t)
        return [ReasoningDelta(text)] if text else []

    def _whole_message(self, item: dict[str, Any]) -> list[Event]:
        out: list[Event] = []
        content = item.get("content") or []
        if not isinstance(content, list):
            raise errors.unexpected(NAME, "response.output_item.done.item.content", content)
        for part in content:
            if isinstance(part, dict) and part.get("type") == "output_text":
                text = _string(part.get("text"), "item.content[].text")
                out += [TextDelta(text)] if text else []
            elif isinstance(part, dict) and part.get("type") == "refusal":
                out += self._refusal(-1, _string(part.get("refusal"), "item.content[].refusal"))
        return out

    # --- deltas ---

    def _text(self, event: dict[str, Any]) -> list[Event]:
        text = _string(event.get("delta"), f"{event['type']}.delta")
        self.items.setdefault(_index(event), {"type": "message", "parts": set()})["text"] = True
        return [TextDelta(text)] if text else []

    def _refusal_delta(self, event: dict[str, Any]) -> list[Event]:
        text = _string(event.get("delta"), "response.refusal.delta.delta")
        return self._refusal(_index(event), text)

    def _refusal(self, index: int, text: str) -> list[Event]:
        state = self.items.setdefault(index, {"type": "message", "parts": set()})
        state["text"] = True
        if not text:
            return []
        self.refused = True
        if not state.get("refusal"):
            state["refusal"] = True
            text = REFUSAL_MARK + text
        return [TextDelta(text)]

    def _summary_part(self, event: dict[str, Any]) -> list[Event]:
        state = self.items.setdefault(_index(event), {"type": "reasoning", "parts": set()})
        part = event.get("summary_index", 0)
        parts: set[Any] = state["parts"]
        later = bool(parts) and part not in parts
        parts.add(part)
        state["break"] = later
        return []

    def _reasoning_delta(self, event: dict[str, Any]) -> list[Event]:
        text = _string(event.get("delta"), f"{event['type']}.delta")
        state = self.items.setdefault(_index(event), {"type": "reasoning", "parts": set()})
        if not text:
            return []
        state["streamed"] = True
        if state.pop("break", False):
            text = SUMMARY_BREAK + text
        return [ReasoningDelta(text)]

    def _arguments(self, event: dict[str, Any]) -> list[Event]:
        delta = _string(event.get("delta"), "response.function_call_arguments.delta.delta")
        state = self.items.setdefault(_index(event), {"type": "function_call", "parts": set()})
        state.setdefault("arguments", []).append(delta)
        return []

    def _arguments_done(self, event: dict[str, Any]) -> list[Event]:
        final = _string(event.get("arguments"), "response.function_call_arguments.done.arguments")
        state = self.items.setdefault(_index(event), {"type": "function_call", "parts": set()})
        state["arguments"] = [final]
        return []

    # --- the end ---

    def _completed(self, event: dict[str, Any]) -> list[Event]:
        response = _object(event.get("response"), f"{event['type']}.response")
        if self.broken is not None:
            raise self.broken
        stop = "tool_use" if self.calls else ("refusal" if self.refused else "end_turn")
        self.finish = Finish(_usage(response.get("usage")), stop)
        return []

    def _incomplete(self, event: dict[str, Any]) -> list[Event]:
        response = _object(event.get("response"), "response.incomplete.response")
        details = response.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, dict) else None
        stop = INCOMPLETE_REASONS.get(str(reason), "end_turn")
        if self.broken is not None and stop != "max_tokens":
            raise self.broken
        # Cut at the output limit: a call cut with it is dropped, the notice says why,
        # and what the response used still counts.
        self.finish = Finish(_usage(response.get("usage")), stop)
        return []

    def _failed(self, event: dict[str, Any]) -> list[Event]:
        response = _object(event.get("response"), "response.failed.response")
        raise failure(response.get("error") or {}, "response.failed.response.error")

    def _error(self, event: dict[str, Any]) -> list[Event]:
        raise failure(event, "error")


_HANDLERS: dict[str, Any] = {
    "response.output_item.added": Translator._added,
    "response.output_item.done": Translator._done,
    "response.output_text.delta": Translator._text,
    "response.refusal.delta": Translator._refusal_delta,
    "response.reasoning_summary_part.added": Translator._summary_part,
    "response.reasoning_summary_text.delta": Translator._reasoning_delta,
    "response.reasoning_text.delta": Translator._reasoning_delta,
    "response.function_call_arguments.delta": Translator._arguments,
    "response.function_call_arguments.done": Translator._arguments_done,
    "response.completed": Translator._completed,
    "response.incomplete": Translator._incomplete,
    "response.failed": Translator._failed,
    "error": Translator._error,
}


def _usage(usage: Any) -> Usage:
    """Neutral usage: input_tokens without the cached ones (read from the cache, as
    Anthropic counts them); output as reported, reasoning included (and apart)."""
    if usage is None:
        return Usage()
    if not isinstance(usage, dict):
        raise errors.unexpected(NAME, "response.usage", usage)
    prompt = _int(usage.get("input_tokens"))
    details = usage.get("input_tokens_details")
    cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else 0
    out_details = usage.get("output_tokens_details")
    reasoning = _int(out_details.get("reasoning_tokens")) if isinstance(out_details, dict) else 0
    return Usage(
        input_tokens=max(prompt - cached, 0),
        output_tokens=_int(usage.get("output_tokens")),
        cache_read_tokens=cached,
        reasoning_tokens=reasoning,
    )


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _string(value: Any, where: str) -> str:
    """A text field of the stream: a string, or absent ("")."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise errors.unexpected(NAME, where, value)
    return value


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise errors.unexpected(NAME, where, value)
    return value


def _index(event: dict[str, Any]) -> int:
    """The output_index of an item's event (0 when a server leaves it out)."""
    index = event.get("output_index", 0)
    if not isinstance(index, int) or isinstance(index, bool):
        raise errors.unexpected(NAME, f"{event['type']}.output_index", index)
    return index
