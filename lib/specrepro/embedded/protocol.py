"""OpenAI request validation and response shapes for the embedded server.

Design:
- Plain functions over the decoded JSON (no pydantic: the H200 image lacks it). Each
  `parse_*` turns a request body into a `GenerationRequest`, or raises `APIError` naming the
  field, so the server answers vLLM's error JSON
  `{"error": {"message", "type": "BadRequestError", "param", "code": 400}}`.
- Field names, defaults and checks follow vLLM 0.33.0's OpenAI server: completions
  `max_tokens` defaults to 16; chat `max_completion_tokens` (or the deprecated `max_tokens`)
  defaults to the rest of the context; `stream_options` needs `stream`; `top_k` 0 or -1 is off;
  `return_token_ids` adds the output's token ids; `n` must be 1 (the engine runs one sequence
  per request). Unknown fields are ignored, as vLLM does.
- Context-length checks need the tokenized prompt, so they are separate
  (`check_context_length`), called once the prompt is encoded.
- Response builders produce the exact dicts of vLLM's completion and chat objects, streamed
  chunks included; `usage` and `metrics.speculative_decoding` are built here once.
- `TextStream` is a request's output text: the tokenizer's incremental decoder (whole UTF-8
  characters only), OpenAI `stop` strings (text cut before the first match), and holding back
  the tail that could still begin a stop string, so a streamed chunk never has to be retracted.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from specrepro.embedded.sampling import SamplingParams

REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # vLLM's CompletionRequest default


class APIError(Exception):
    """An error answered as OpenAI/vLLM error JSON with an HTTP status."""

    TYPES: ClassVar[dict[int, str]] = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError",
                                      503: "ServiceUnavailableError"}

    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.message, self.param, self.status = message, param, status

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.TYPES.get(self.status, "Error"),
                          "param": self.param, "code": self.status}}


@dataclass
class GenerationRequest:
    """One validated request, independent of the endpoint it came from."""

    kind: str  # "completion" | "chat"
    model: str
    prompt: str | None = None  # completion text prompt
    prompt_token_ids: list[int] | None = None  # completion token prompt
    messages: list[dict] | None = None  # chat
    chat_template_kwargs: dict = field(default_factory=dict)
    add_generation_prompt: bool = True
    max_tokens: int | None = None  # None: up to the context (chat default)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    stream: bool = False
    include_usage: bool = False
    continuous_usage_stats: bool = False
    return_token_ids: bool = False


# --------------------------------------------------------------------------- field checks

def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x) -> bool:
    return (isinstance(x, (int, float)) and not isinstance(x, bool)
            and math.isfinite(float(x)))


def _get(body: dict, name: str, check, expected: str, default=None):
    """body[name] if present and not null, checked; else default."""
    value = body.get(name)
    if value is None:
        return default
    if not check(value):
        raise APIError(f"{name}: expected {expected}, got {value!r}", param=name)
    return value


def _bool(body: dict, name: str, default: bool = False) -> bool:
    return _get(body, name, lambda v: isinstance(v, bool), "a boolean", default)


def _sampling(body: dict) -> SamplingParams:
    temperature = float(_get(body, "temperature", _is_number, "a number", 1.0))
    if temperature < 0:
        raise APIError(f"temperature must be non-negative, got {temperature}.",
                       param="temperature")
    top_p = float(_get(body, "top_p", _is_number, "a number", 1.0))
    if not 0.0 < top_p <= 1.0:
        raise APIError(f"top_p must be in (0, 1], got {top_p}.", param="top_p")
    top_k = _get(body, "top_k", _is_int, "an integer", -1)
    if top_k < -1:
        raise APIError(f"top_k must be -1 (disable), 0 (disable) or at least 1, got {top_k}.",
                       param="top_k")
    seed = _get(body, "seed", _is_int, "an integer", None)
    return SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)


def _stop(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise APIError(f"stop: expected a string or a list of strings, got {stop!r}",
                       param="stop")
    return [s for s in stop if s]  # an empty stop string would end every request at once


def _max_tokens(body: dict, name: str, default: int | None) -> int | None:
    value = _get(body, name, _is_int, "an integer", default)
    if value is not None and value < 1:
        raise APIError(f"{name} must be at least 1, got {value}.", param=name)
    return value


def _common(body: Any, kind: str, served_model: str | Sequence[str]) -> dict:
    """Fields shared by both endpoints, as GenerationRequest keyword arguments.
    `served_model`: the names the model answers to, the default first."""
    if not isinstance(body, dict):
        raise APIError(f"request body must be a JSON object, got {type(body).__name__}")
    names = (served_model,) if isinstance(served_model, str) else tuple(served_model)
    model = _get(body, "model", lambda v: isinstance(v, str), "a string", names[0])
    if model not in names:
        # vLLM answers 404 here; we answer 400 like every other invalid field
        raise APIError(f"The model `{model}` does not exist.", param="model")
    n = _get(body, "n", _is_int, "an integer", 1)
    if n != 1:
        raise APIError(f"n must be 1 on the embedded engine, got {n}.", param="n")
    if body.get("logprobs") not in (None, False) or body.get("top_logprobs") is not None:
        raise APIError("logprobs are not supported by the embedded engine.", param="logprobs")
    stream = _bool(body, "stream")
    options = _get(body, "stream_options", lambda v: isinstance(v, dict), "an object", None)
    if options is not None and not stream:
        raise APIError("Stream options can only be defined when `stream=True`.",
                       param="stream_options")
    options = options or {}
    stop_token_ids = _get(body, "stop_token_ids",
                          lambda v: isinstance(v, list) and all(_is_int(t) for t in v),
                          "a list of integers", [])
    include_usage = _bool(options, "include_usage")
    return {
        "kind": kind, "model": model, "sampling": _sampling(body), "stop": _stop(body),
        "stop_token_ids": list(stop_token_ids), "ignore_eos": _bool(body, "ignore_eos"),
        "stream": stream, "include_usage": include_usage,
        # as vLLM: usage on every chunk only when the final usage chunk is asked for too
        "continuous_usage_stats": include_usage and _bool(options, "continuous_usage_stats"),
        "return_token_ids": _bool(body, "return_token_ids"),
    }


def parse_completion(body: Any, served_model: str | Sequence[str]) -> GenerationRequest:
    """A `/v1/completions` body -> GenerationRequest (prompt: a string or token ids)."""
    kw = _common(body, "completion", served_model)
    prompt = body.get("prompt")
    # a batch of one is accepted as the prompt itself; larger batches are not served
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        kw["prompt"] = prompt
    elif isinstance(prompt, list) and prompt and all(_is_int(t) and t >= 0 for t in prompt):
        kw["prompt_token_ids"] = list(prompt)
    elif isinstance(prompt, list) and len(prompt) > 1 and all(
            isinstance(p, (str, list)) for p in prompt):
        raise APIError("batched prompts are not supported by the embedded engine; "
                       "send one request per prompt.", param="prompt")
    else:
        raise APIError(f"prompt: expected a string or a non-empty list of token ids, "
                       f"got {prompt!r}", param="prompt")
    if body.get("echo"):
        raise APIError("echo is not supported by the embedded engine.", param="echo")
    kw["max_tokens"] = _max_tokens(body, "max_tokens", COMPLETIONS_DEFAULT_MAX_TOKENS)
    return GenerationRequest(**kw)


def _messages(body: dict) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise APIError(f"messages: expected a non-empty list, got {messages!r}",
                       param="messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise APIError(f"messages[{i}]: expected an object with a string role",
                           param="messages")
        content = m.get("content")
        if isinstance(content, list):  # OpenAI content parts: only text is served
            texts = []
            for part in content:
                if not (isinstance(part, dict) and part.get("type") == "text"
                        and isinstance(part.get("text"), str)):
                    raise APIError(f"messages[{i}].content: only text parts are supported",
                                   param="messages")
                texts.append(part["text"])
            content = "\n".join(texts)
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise APIError(f"messages[{i}].content: expected a string or text parts",
                           param="messages")
        out.append({"role": m["role"], "content": content})
    return out


def parse_chat(body: Any, served_model: str | Sequence[str],
               default_chat_template_kwargs: dict | None = None) -> GenerationRequest:
    """A `/v1/chat/completions` body -> GenerationRequest (messages, chat template kwargs)."""
    kw = _common(body, "chat", served_model)
    kw["messages"] = _messages(body)
    template_kwargs = dict(default_chat_template_kwargs or {})
    template_kwargs.update(_get(body, "chat_template_kwargs", lambda v: isinstance(v, dict),
                                "an object", {}))
    effort = _get(body, "reasoning_effort", lambda v: v in REASONING_EFFORTS,
                  f"one of {', '.join(REASONING_EFFORTS)}", None)
    if effort is not None and "enable_thinking" not in template_kwargs:
        template_kwargs["enable_thinking"] = effort != "none"  # vLLM's rule
    kw["chat_template_kwargs"] = template_kwargs
    kw["add_generation_prompt"] = _bool(body, "add_generation_prompt", True)
    limit = _max_tokens(body, "max_completion_tokens", None)
    kw["max_tokens"] = limit if limit is not None else _max_tokens(body, "max_tokens", None)
    return GenerationRequest(**kw)


def check_context_length(num_prompt_tokens: int, max_tokens: int | None,
                         max_model_len: int) -> int:
    """The request's max_tokens once the prompt length is known (vLLM's messages)."""
    if num_prompt_tokens >= max_model_len:
        raise APIError(f"This model's maximum context length is {max_model_len} tokens. "
                       f"However, your request has {num_prompt_tokens} input tokens. "
                       "Please reduce the length of the input messages.", param="prompt")
    room = max_model_len - num_prompt_tokens
    if max_tokens is None:
        return room
    if max_tokens > room:
        raise APIError(f"This model's maximum context length is {max_model_len} tokens. "
                       f"However, you requested {num_prompt_tokens + max_tokens} tokens "
                       f"({num_prompt_tokens} in the messages, {max_tokens} in the "
                       "completion). Please reduce the length of the messages or completion.",
                       param="max_tokens")
    return max_tokens


# --------------------------------------------------------------------------- responses

@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # per-request speculative counters, cumulative (engine RequestOutput)
    num_spec_steps: int = 0
    num_accepted_draft_tokens: int = 0
    num_draft_tokens: int = 0

    def body(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}

    def spec_metrics(self, num_spec_tokens: int) -> dict:
        """vLLM's `metrics.speculative_decoding` summary (its per-request spec-decode metrics)."""
        steps, accepted, drafted = (self.num_spec_steps, self.num_accepted_draft_tokens,
                                    self.num_draft_tokens)
        return {"speculative_decoding": {
            "mean_acceptance_length": 1.0 + accepted / steps if steps else 1.0,
            "draft_acceptance_rate": accepted / drafted if drafted else 0.0,
            "num_spec_steps": steps, "num_accepted_draft_tokens": accepted,
            "num_draft_tokens": drafted, "num_spec_tokens": num_spec_tokens,
        }}


class ResponseBuilder:
    """The response and chunk dicts of one request, in vLLM's shapes for its endpoint."""

    def __init__(self, req: GenerationRequest, request_id: str,
                 spec_tokens: int | None):
        self.req, self.id, self.created = req, request_id, int(time.time())
        self.spec_tokens = spec_tokens  # None: per-request spec metrics off
        chat = req.kind == "chat"
        self.object = "chat.completion" if chat else "text_completion"
        self.chunk_object = "chat.completion.chunk" if chat else "text_completion"

    def _envelope(self, obj: str, choices: list) -> dict:
        return {"id": self.id, "object": obj, "created": self.created,
                "model": self.req.model, "choices": choices}

    def _choice(self, text: str | None, finish_reason, stop_reason, token_ids, delta: bool,
                first: bool = False) -> dict:
        if self.req.kind == "chat":
            if delta:
                msg = {"role": "assistant", "content": text or ""} if first else (
                    {"content": text} if text is not None else {})
                choice = {"index": 0, "delta": msg}
            else:
                choice = {"index": 0, "message": {"role": "assistant", "content": text,
                                                  "reasoning_content": None, "tool_calls": []}}
        else:
            choice = {"index": 0, "text": text or ""}
        choice.update(logprobs=None, finish_reason=finish_reason, stop_reason=stop_reason)
        if self.req.return_token_ids and token_ids is not None:
            choice["token_ids"] = list(token_ids)
        return choice

    def full(self, text: str, finish_reason, stop_reason, token_ids: list[int],
             prompt_token_ids: list[int], usage: Usage) -> dict:
        body = self._envelope(self.object, [self._choice(text, finish_reason, stop_reason,
                                                         token_ids, delta=False)])
        if self.req.return_token_ids:
            body["prompt_token_ids"] = list(prompt_token_ids)
        body["usage"] = usage.body()
        if self.spec_tokens is not None:
            body["metrics"] = usage.spec_metrics(self.spec_tokens)
        return body

    def chunk(self, text: str | None, token_ids: list[int], finish_reason=None,
              stop_reason=None, usage: Usage | None = None, first: bool = False) -> dict:
        body = self._envelope(self.chunk_object, [self._choice(
            text, finish_reason, stop_reason, token_ids, delta=True, first=first)])
        if usage is not None and self.req.continuous_usage_stats:
            body["usage"] = usage.body()
        return body

    def usage_chunk(self, usage: Usage) -> dict:
        """The final chunk of `include_usage`: no choices, the usage (and spec metrics)."""
        body = self._envelope(self.chunk_object, [])
        body["usage"] = usage.body()
        if self.spec_tokens is not None:
            body["metrics"] = usage.spec_metrics(self.spec_tokens)
        return body


# --------------------------------------------------------------------------- output text

class TextStream:
    """One request's output text: incremental detokenization, stop strings, held-back text."""

    def __init__(self, tokenizer, stop: list[str]):
        self.tokenizer, self.stop = tokenizer, stop
        self.decoder = tokenizer.stream_decoder(skip_special_tokens=True)
        self.text = ""  # decoded so far, cut before a stop string once one is found
        self.sent = 0  # characters of self.text already handed out
        self.stop_reason: str | None = None
        self._max_stop = max((len(s) for s in stop), default=0)

    def add(self, token_ids: list[int]) -> bool:
        """Decode new tokens; True when a stop string has ended the text."""
        start = len(self.text)
        for t in token_ids:
            piece = self.decoder.step(self.tokenizer.tok, t)
            if piece:
                self.text += piece
        if not self.stop or self.stop_reason is not None:
            return False
        # a stop string ending in the new text starts at most max_stop - 1 characters before it
        lo = max(0, start - self._max_stop + 1)
        hits = [(i, s) for s in self.stop if (i := self.text.find(s, lo)) != -1]
        if not hits:
            return False
        at, self.stop_reason = min(hits)
        self.text = self.text[:at]
        return True

    def _held(self) -> int:
        """Length of the longest tail of the unsent text that begins some stop string."""
        tail = self.text[self.sent:]
        for n in range(min(len(tail), self._max_stop - 1), 0, -1):
            if any(s.startswith(tail[-n:]) for s in self.stop):
                return n
        return 0

    def delta(self, finished: bool) -> str:
        end = len(self.text) if finished else len(self.text) - self._held()
        out = self.text[self.sent:end]
        self.sent = max(self.sent, end)
        return out
