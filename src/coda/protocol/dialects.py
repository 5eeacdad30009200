"""Request parsing and response shapes of the four APIs the fake engine speaks.

Each dialect turns a JSON body into a ``Generation`` (prompt words rendered with the shared
template, output length, streaming, tool call) and renders the words the engine releases in its
API's shape: OpenAI chat completions, legacy completions and responses, and Anthropic messages,
streaming (SSE) and not. Client mistakes raise ``ApiError`` (rendered as the API's error body).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from coda.protocol import tokenizer as tok
from coda.serving.errors import ApiError

Json = dict[str, Any]


@dataclass(slots=True)
class Generation:
    """What a request asks the engine for, whatever its API."""

    prompt: list[str]
    max_tokens: int | None  # None: the engine's default length
    stream: bool
    include_usage: bool = False
    tool: str | None = None  # answer with a call of this function
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:24])
    created: int = field(default_factory=lambda: int(time.time()))


@dataclass(slots=True)
class Outcome:
    """What the engine did: the words it produced and the counts a usage block reports."""

    words: list[str]
    prompt_tokens: int
    cached_tokens: int
    truncated: bool  # stopped by max_tokens (rather than by choosing to stop)


def sse(data: Json | str, event: str | None = None) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return (f"event: {event}\n" if event else "").encode() + b"data: " + payload.encode() + b"\n\n"


# --- parsing helpers -----------------------------------------------------------------------
def _need(body: Json, key: str, kinds: type | tuple[type, ...], what: str) -> Any:
    if key not in body:
        raise ApiError(400, f"{key} is required ({what})", param=key)
    value = body[key]
    if not isinstance(value, kinds) or isinstance(value, bool):
        raise ApiError(400, f"{key} must be {what}", param=key)
    return value


def _max_tokens(body: Json, *keys: str) -> int | None:
    for key in keys:
        value = body.get(key)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ApiError(400, f"{key} must be an integer >= 1, got {value!r}", param=key)
        return value
    return None


def _stream(body: Json) -> bool:
    value = body.get("stream", False)
    if not isinstance(value, bool) and value is not None:
        raise ApiError(400, f"stream must be true or false, got {value!r}", param="stream")
    return bool(value)


def content_text(content: Any) -> str:
    """The text of a message's content: a string, or the text of its parts (images are ignored)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            if isinstance(part, str):
                out.append(part)
            elif isinstance(part, dict):
                if isinstance(part.get("text"), str):
                    out.append(part["text"])
                elif part.get("type") == "tool_use":
                    out.append(f"{part.get('name', '')} {json.dumps(part.get('input', {}))}")
                elif part.get("type") == "tool_result":
                    out.append(content_text(part.get("content")))
        return " ".join(out)
    raise ApiError(400, f"message content must be a string or a list of parts, got {type(content).__name__}", param="content")


def _messages(value: Any, param: str) -> list[tuple[str, str]]:
    """(role, text) of chat messages or responses-API input items."""
    if not isinstance(value, list) or not value:
        raise ApiError(400, f"{param} must be a non-empty list of messages", param=param)
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            raise ApiError(400, f"{param}[{i}] must be an object", param=param)
        kind = m.get("type")
        if kind == "function_call":
            role, text = "assistant", f"{m.get('name', '')} {m.get('arguments', '')}"
        elif kind == "function_call_output":
            role, text = "tool", str(m.get("output", ""))
        else:
            role = m.get("role")
            if not isinstance(role, str):
                raise ApiError(400, f"{param}[{i}].role must be a string", param=param)
            text = content_text(m.get("content"))
            for call in m.get("tool_calls") or ():  # an assistant's earlier tool calls are part of the context
                fn = call.get("function", {}) if isinstance(call, dict) else {}
                text += f" {fn.get('name', '')} {fn.get('arguments', '')}"
        out.append((role, text))
    return out


def _openai_tool(body: Json) -> str | None:
    """The function to call: the named one, else the first tool unless tool_choice is "none"."""
    tools = body.get("tools")
    if not tools:
        return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise ApiError(400, "tools must be a list of objects", param="tools")
    choice = body.get("tool_choice", "auto")
    if choice == "none":
        return None
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") or choice.get("name")
        if isinstance(name, str):
            return name
    first = tools[0]
    name = (first.get("function") or {}).get("name") or first.get("name")
    if not isinstance(name, str):
        raise ApiError(400, "tools[0] has no function name", param="tools")
    return name


def _usage_openai(o: Outcome) -> Json:
    n = len(o.words)
    return {
        "prompt_tokens": o.prompt_tokens,
        "completion_tokens": n,
        "total_tokens": o.prompt_tokens + n,
        "prompt_tokens_details": {"cached_tokens": o.cached_tokens},
    }


def _arguments(words: list[str]) -> str:
    return json.dumps({"input": " ".join(words)})


Words = AsyncIterator[list[str]]
Finish = Callable[[], Outcome]


# --- dialects ------------------------------------------------------------------------------
class Chat:
    """OpenAI ``/v1/chat/completions``."""

    error_body = staticmethod(ApiError.openai_body)

    @staticmethod
    def parse(body: Json) -> Generation:
        if body.get("n", 1) != 1:
            raise ApiError(400, "n must be 1: the fake engine generates one choice", param="n")
        msgs = _messages(body.get("messages"), "messages")
        opts = body.get("stream_options") or {}
        return Generation(
            prompt=tok.render(msgs),
            max_tokens=_max_tokens(body, "max_completion_tokens", "max_tokens"),
            stream=_stream(body),
            include_usage=bool(isinstance(opts, dict) and opts.get("include_usage")),
            tool=_openai_tool(body),
        )

    @staticmethod
    def _finish_reason(g: Generation, o: Outcome) -> str:
        return "tool_calls" if g.tool else ("length" if o.truncated else "stop")

    @staticmethod
    def complete(g: Generation, model: str, o: Outcome) -> Json:
        msg: Json = {"role": "assistant", "content": None if g.tool else " ".join(o.words)}
        if g.tool:
            msg["tool_calls"] = [{"id": f"call_{g.id}", "type": "function", "function": {"name": g.tool, "arguments": _arguments(o.words)}}]
        return {
            "id": f"chatcmpl-{g.id}",
            "object": "chat.completion",
            "created": g.created,
            "model": model,
            "choices": [{"index": 0, "message": msg, "logprobs": None, "finish_reason": Chat._finish_reason(g, o)}],
            "usage": _usage_openai(o),
        }

    @staticmethod
    async def stream(g: Generation, model: str, words: Words, finish: Finish) -> AsyncIterator[bytes]:
        head = {"id": f"chatcmpl-{g.id}", "object": "chat.completion.chunk", "created": g.created, "model": model}

        def chunk(delta: Json, reason: str | None = None) -> bytes:
            return sse({**head, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}]})

        first = True
        async for new in words:
            piece = " ".join(new)
            if g.tool:
                args = ('{"input": "' if first else " ") + piece
                call: Json = {"index": 0, "function": {"arguments": args}}
                if first:
                    call = {"index": 0, "id": f"call_{g.id}", "type": "function", "function": {"name": g.tool, "arguments": args}}
                yield chunk({"role": "assistant", "tool_calls": [call]} if first else {"tool_calls": [call]})
            else:
                yield chunk({"role": "assistant", "content": piece} if first else {"content": " " + piece})
            first = False
        o = finish()
        if g.tool:
            yield chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"}' if not first else _arguments([])}}]})
        yield chunk({}, Chat._finish_reason(g, o))
        if g.include_usage:
            yield sse({**head, "choices": [], "usage": _usage_openai(o)})
        yield sse("[DONE]")


class Completions:
    """OpenAI ``/v1/completions``: the prompt is raw text (no chat template)."""

    error_body = staticmethod(ApiError.openai_body)

    @staticmethod
    def parse(body: Json) -> Generation:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise ApiError(400, "prompt must be a string (one prompt per request)", param="prompt")
        words = prompt.split()
        if not words:
            raise ApiError(400, "prompt is empty", param="prompt")
        opts = body.get("stream_options") or {}
        return Generation(
            prompt=words,
            max_tokens=_max_tokens(body, "max_tokens"),
            stream=_stream(body),
            include_usage=bool(isinstance(opts, dict) and opts.get("include_usage")),
        )

    @staticmethod
    def complete(g: Generation, model: str, o: Outcome) -> Json:
        return {
            "id": f"cmpl-{g.id}",
            "object": "text_completion",
            "created": g.created,
            "model": model,
            "choices": [{"index": 0, "text": " ".join(o.words), "logprobs": None, "finish_reason": "length" if o.truncated else "stop"}],
            "usage": _usage_openai(o),
        }

    @staticmethod
    async def stream(g: Generation, model: str, words: Words, finish: Finish) -> AsyncIterator[bytes]:
        head = {"id": f"cmpl-{g.id}", "object": "text_completion", "created": g.created, "model": model}

        def chunk(text: str, reason: str | None = None) -> bytes:
            return sse({**head, "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": reason}]})

        first = True
        async for new in words:
            yield chunk(("" if first else " ") + " ".join(new))
            first = False
        o = finish()
        yield chunk("", "length" if o.truncated else "stop")
        if g.include_usage:
            yield sse({**head, "choices": [], "usage": _usage_openai(o)})
        yield sse("[DONE]")


class Responses:
    """OpenAI ``/v1/responses``."""

    error_body = staticmethod(ApiError.openai_body)

    @staticmethod
    def parse(body: Json) -> Generation:
        items = body.get("input")
        msgs: list[tuple[str, str]] = []
        if isinstance(body.get("instructions"), str):
            msgs.append(("system", body["instructions"]))
        if isinstance(items, str):
            msgs.append(("user", items))
        else:
            msgs.extend(_messages(items, "input"))
        return Generation(
            prompt=tok.render(msgs), max_tokens=_max_tokens(body, "max_output_tokens"), stream=_stream(body), tool=_openai_tool(body)
        )

    @staticmethod
    def _item(g: Generation, text: str, done: bool) -> Json:
        status = "completed" if done else "in_progress"
        if g.tool:
            return {
                "type": "function_call",
                "id": f"fc_{g.id}",
                "call_id": f"call_{g.id}",
                "name": g.tool,
                "arguments": text,
                "status": status,
            }
        content = [{"type": "output_text", "text": text, "annotations": []}] if done else []
        return {"type": "message", "id": f"msg_{g.id}", "status": status, "role": "assistant", "content": content}

    @staticmethod
    def _response(g: Generation, model: str, o: Outcome | None) -> Json:
        out: Json = {
            "id": f"resp_{g.id}",
            "object": "response",
            "created_at": g.created,
            "model": model,
            "status": "in_progress",
            "output": [],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "error": None,
            "incomplete_details": None,
        }
        if o is not None:
            text = _arguments(o.words) if g.tool else " ".join(o.words)
            n = len(o.words)
            out.update(
                status="completed",
                output=[Responses._item(g, text, True)],
                usage={
                    "input_tokens": o.prompt_tokens,
                    "input_tokens_details": {"cached_tokens": o.cached_tokens},
                    "output_tokens": n,
                    "output_tokens_details": {"reasoning_tokens": 0},
                    "total_tokens": o.prompt_tokens + n,
                },
            )
        return out

    @staticmethod
    def complete(g: Generation, model: str, o: Outcome) -> Json:
        return Responses._response(g, model, o)

    @staticmethod
    async def stream(g: Generation, model: str, words: Words, finish: Finish) -> AsyncIterator[bytes]:
        seq = 0

        def ev(kind: str, **data: Any) -> bytes:
            nonlocal seq
            seq += 1
            return sse({"type": kind, "sequence_number": seq - 1, **data}, event=kind)

        item_id = f"fc_{g.id}" if g.tool else f"msg_{g.id}"
        yield ev("response.created", response=Responses._response(g, model, None))
        yield ev("response.output_item.added", output_index=0, item=Responses._item(g, "", False))
        if not g.tool:
            yield ev(
                "response.content_part.added",
                item_id=item_id,
                output_index=0,
                content_index=0,
                part={"type": "output_text", "text": "", "annotations": []},
            )
        first = True
        async for new in words:
            piece = ('{"input": "' if g.tool and first else "" if first else " ") + " ".join(new)
            if g.tool:
                yield ev("response.function_call_arguments.delta", item_id=item_id, output_index=0, delta=piece)
            else:
                yield ev("response.output_text.delta", item_id=item_id, output_index=0, content_index=0, delta=piece, logprobs=[])
            first = False
        o = finish()
        full = Responses._response(g, model, o)
        item = full["output"][0]
        if g.tool:
            yield ev(
                "response.function_call_arguments.delta", item_id=item_id, output_index=0, delta='"}' if not first else item["arguments"]
            )
            yield ev("response.function_call_arguments.done", item_id=item_id, output_index=0, arguments=item["arguments"])
        else:
            text = item["content"][0]["text"]
            yield ev("response.output_text.done", item_id=item_id, output_index=0, content_index=0, text=text, logprobs=[])
            yield ev("response.content_part.done", item_id=item_id, output_index=0, content_index=0, part=item["content"][0])
        yield ev("response.output_item.done", output_index=0, item=item)
        yield ev("response.completed", response=full)


class Messages:
    """Anthropic ``/v1/messages``."""

    error_body = staticmethod(ApiError.anthropic_body)

    @staticmethod
    def parse(body: Json) -> Generation:
        msgs: list[tuple[str, str]] = []
        if body.get("system") is not None:
            msgs.append(("system", content_text(body["system"])))
        msgs.extend(_messages(body.get("messages"), "messages"))
        max_tokens = _need(body, "max_tokens", int, "an integer >= 1")
        if max_tokens < 1:
            raise ApiError(400, f"max_tokens must be >= 1, got {max_tokens}", param="max_tokens")
        tool = None
        tools = body.get("tools")
        choice = body.get("tool_choice") or {"type": "auto"}
        if tools and isinstance(tools, list) and isinstance(choice, dict) and choice.get("type") != "none":
            tool = choice.get("name") if choice.get("type") == "tool" else tools[0].get("name") if isinstance(tools[0], dict) else None
            if not isinstance(tool, str):
                raise ApiError(400, "tools[0] needs a name", param="tools")
        return Generation(prompt=tok.render(msgs), max_tokens=max_tokens, stream=_stream(body), tool=tool)

    @staticmethod
    def _usage(o: Outcome) -> Json:
        return {
            "input_tokens": o.prompt_tokens - o.cached_tokens,
            "cache_read_input_tokens": o.cached_tokens,
            "cache_creation_input_tokens": 0,
            "output_tokens": len(o.words),
        }

    @staticmethod
    def _stop(g: Generation, o: Outcome) -> str:
        return "tool_use" if g.tool else ("max_tokens" if o.truncated else "end_turn")

    @staticmethod
    def complete(g: Generation, model: str, o: Outcome) -> Json:
        text = " ".join(o.words)
        block: Json = (
            {"type": "tool_use", "id": f"toolu_{g.id}", "name": g.tool, "input": {"input": text}}
            if g.tool
            else {"type": "text", "text": text}
        )
        return {
            "id": f"msg_{g.id}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [block],
            "stop_reason": Messages._stop(g, o),
            "stop_sequence": None,
            "usage": Messages._usage(o),
        }

    @staticmethod
    async def stream(g: Generation, model: str, words: Words, finish: Finish) -> AsyncIterator[bytes]:
        def ev(kind: str, **data: Any) -> bytes:
            return sse({"type": kind, **data}, event=kind)

        start = {
            "id": f"msg_{g.id}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        yield ev("message_start", message=start)
        block = {"type": "tool_use", "id": f"toolu_{g.id}", "name": g.tool, "input": {}} if g.tool else {"type": "text", "text": ""}
        yield ev("content_block_start", index=0, content_block=block)
        first = True
        async for new in words:
            piece = " ".join(new)
            if g.tool:
                delta = {"type": "input_json_delta", "partial_json": ('{"input": "' if first else " ") + piece}
            else:
                delta = {"type": "text_delta", "text": ("" if first else " ") + piece}
            yield ev("content_block_delta", index=0, delta=delta)
            first = False
        o = finish()
        if g.tool and not first:
            yield ev("content_block_delta", index=0, delta={"type": "input_json_delta", "partial_json": '"}'})
        yield ev("content_block_stop", index=0)
        yield ev("message_delta", delta={"stop_reason": Messages._stop(g, o), "stop_sequence": None}, usage=Messages._usage(o))
        yield ev("message_stop")


DIALECTS = {"/v1/chat/completions": Chat, "/v1/completions": Completions, "/v1/responses": Responses, "/v1/messages": Messages}
