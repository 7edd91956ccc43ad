"""The OpenAI-compatible HTTP endpoints over an `Engine`: `GET /v1/models`,
`POST /v1/completions`, `POST /v1/chat/completions` (FastAPI).

A request's body is read as JSON and checked field by field before anything is sampled: a bad
field is a 400 with OpenAI's error body, its message one line naming the field and what was
expected. Beyond OpenAI's fields a request takes `return_token_ids` (each choice then has
`token_ids`, the completion's tokens, and `prompt_token_ids`) and `top_k`; every response
has `seed`, the seed its completions drew with (given, or chosen by the server).

The text of a completion is its tokens decoded; a `stop` string ends it (the text stops
before it, the tokens run through the one that completes it). A chat request with `tools`
ends a completion at the closing tag of its first call (`</tool_call>`) and returns the
calls that parse (`tools.calls.call_objects`) as OpenAI `tool_calls`. `stream: true` sends
the same completion as server-sent events, one token a chunk, once its batch is sampled.
"""


import asyncio
import json
import secrets
import time
import uuid
from collections.abc import Sequence
from typing import Any

from grpo_jax.runner.checks import MIN_TEMPERATURE
from grpo_jax.serve.engine import SEED_LIMIT, Completion, Engine, Request, Settings
from grpo_jax.text import prompt_ids
from grpo_jax.tools.calls import CLOSE, OPEN, call_objects, call_text

__all__ = ["RequestError", "SamplerError", "create_app", "finished_text"]

MISSING_PACKAGES = ('the server needs fastapi and uvicorn: pip install -e ".[serve]"')
COMPLETIONS_MAX_TOKENS = 16  # /v1/completions' default max_tokens (OpenAI's)
CHAT_MAX_TOKENS = 256  # /v1/chat/completions' default (at most what the context leaves)
MAX_STOPS = 4
ROLES = ("system", "user", "assistant", "tool")


class RequestError(ValueError):
    """A bad request: the field (`param`) and a one-line message naming it."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


class SamplerError(RuntimeError):
    """Sampling a valid request failed (a 500; the message is one line)."""


def _fail(field: str, message: str):
    raise RequestError(field, message)


# ---- fields ----------------------------------------------------------------------------------

def _integer(body, field, default, low, high=None):
    value = body.get(field, default)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (
            high is not None and value > high):
        bound = f"[{low}, {high}]" if high is not None else f">= {low}"
        _fail(field, f"expected an integer {bound}, got {value!r:.60}")
    return value


def _number(body, field, default, low, high, low_open=False):
    value = body.get(field, default)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value > high or (
            value <= low if low_open else value < low):
        _fail(field, f"expected a number in {'(' if low_open else '['}{low}, {high}], got "
                     f"{value!r:.60}")
    return float(value)


def _flag(body, field):
    value = body.get(field, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        _fail(field, f"expected true or false, got {value!r:.60}")
    return value


def _stops(body) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) \
            or len(stops) > MAX_STOPS:
        _fail("stop", f"expected a non-empty string or a list of at most {MAX_STOPS}, got "
                      f"{stop!r:.60}")
    return stops


def _unsupported(body, defaults: dict) -> None:
    """A field the server does not implement, set to anything but its neutral value."""
    for field, neutral in defaults.items():
        value = body.get(field)
        if value is not None and value not in neutral:
            _fail(field, f"not supported by this server (got {value!r:.60}); expected "
                         f"{' or '.join(map(repr, neutral))} or no value")


def _common(body, engine: Engine):
    """The fields both endpoints share: (n, max_tokens or None for the default, Settings,
    seed, stream, return_token_ids)."""
    model = body.get("model")
    if model != engine.served.name:
        _fail("model", f"{model!r:.60} is not served here; expected {engine.served.name!r}")
    n = _integer(body, "n", 1, 1, engine.max_rows)
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
    if max_tokens is not None:
        field = "max_tokens" if "max_tokens" in body else "max_completion_tokens"
        max_tokens = _integer(body, field, None, 1)
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    if 0 < temperature < MIN_TEMPERATURE:  # logits / temperature would overflow
        _fail("temperature", f"expected 0 (greedy) or a number in [{MIN_TEMPERATURE}, 2], got "
                             f"{temperature!r}")
    settings = Settings(temperature=temperature, top_p=_number(body, "top_p", 1.0, 0.0, 1.0,
                                                                  low_open=True),
                        top_k=_integer(body, "top_k", 0, 0))
    if settings.greedy:  # the argmax: top_p and top_k do not change it
        settings = Settings(temperature=0.0)
    seed = body.get("seed")
    seed = secrets.randbelow(SEED_LIMIT) if seed is None else _integer(body, "seed", 0, 0,
                                                                        SEED_LIMIT - 1)
    _unsupported(body, {"presence_penalty": (0, 0.0), "frequency_penalty": (0, 0.0),
                        "logit_bias": ({},), "echo": (False,), "best_of": (1, n),
                        "suffix": ("",)})
    return n, max_tokens, settings, seed, _flag(body, "stream"), _flag(body, "return_token_ids")


def _max_tokens(engine, field_of_prompt, ids, max_tokens, default):
    context = engine.served.context
    if len(ids) >= context:
        _fail(field_of_prompt, f"{len(ids)} tokens leave no room for a completion in the "
                               f"model's context of {context} tokens")
    if max_tokens is None:
        return min(default, context - len(ids))
    if len(ids) + max_tokens > context:
        _fail("max_tokens", f"the prompt's {len(ids)} tokens + max_tokens {max_tokens} exceed "
                            f"the model's context of {context} tokens")
    return max_tokens


# ---- completions' text -----------------------------------------------------------------------

def finished_text(tokenizer, completion: Completion, stops: Sequence[str] = (),
                  stops_kept: Sequence[str] = ()):
    """A completion as the client sees it: (text, tokens, log-probs, pieces, finish reason).

    The text is the tokens decoded, cut at the first `stops` string (the text ends before
    it) or `stops_kept` string (after it); the tokens run through the one whose text
    completes it. pieces[i] is the text token i adds (they join to the text).
    """
    tokens = completion.tokens
    texts = [tokenizer.decode(tokens[:k + 1]) for k in range(len(tokens))]
    cut, reason = None, ("stop" if completion.ended else "length")
    for k, text in enumerate(texts):
        ends = [(text.find(s), len(s) if s in stops_kept else 0)
                for s in (*stops, *stops_kept) if s in text]
        if ends:
            start, kept = min(ends)
            cut, final, reason = k + 1, text[:start + kept], "stop"
            break
    if cut is None:
        final, cut = (texts[-1] if texts else ""), len(tokens)
    pieces, done = [], 0
    for text in texts[:cut]:
        end = max(done, min(len(text), len(final)))
        pieces.append(final[done:end])
        done = end
    if pieces:
        pieces[-1] += final[done:]
    return final, tokens[:cut], completion.logprobs[:cut], pieces, reason


# ---- chat prompts ----------------------------------------------------------------------------

def _content(message, index) -> str:
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    _fail(f"messages[{index}].content", "expected a string or a list of text parts, got "
                                        f"{content!r:.60}")


def _assistant_calls(message, index) -> str:
    """An assistant message's tool_calls in the checkpoint's format (its text)."""
    text = ""
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        _fail(f"messages[{index}].tool_calls", f"expected a list, got {calls!r:.60}")
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        try:
            name, arguments = function["name"], json.loads(function["arguments"])
            if not isinstance(name, str) or not isinstance(arguments, dict):
                raise TypeError
        except (TypeError, KeyError, ValueError):
            _fail(f"messages[{index}].tool_calls[{j}]", "expected {\"function\": {\"name\": "
                  "string, \"arguments\": a JSON object as a string}}")
        text += call_text(name, arguments)
    return text


def chat_prompt(engine: Engine, messages, tools) -> str:
    """The prompt text of a chat: the tokenizer's chat template (the trainer's
    `apply_chat_template`, with `tools`), or without one the run's own prompt for a single
    user message."""
    if not isinstance(messages, list) or not messages:
        _fail("messages", f"expected a non-empty list of messages, got {messages!r:.60}")
    plain = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            _fail(f"messages[{index}]", f"expected an object with a role of {ROLES}, got "
                                        f"{message!r:.60}")
        content = _content(message, index)
        if message["role"] == "assistant":
            content += _assistant_calls(message, index)
        plain.append({"role": message["role"], "content": content})
    served = engine.served
    if served.chat_template is not None:
        from grpo_jax.text.chat import ChatTemplateError

        try:
            return served.tokenizer.apply_chat_template(plain, add_generation_prompt=True,
                                                        **({"tools": tools} if tools else {}))
        except ChatTemplateError as err:
            _fail("messages", str(err))
    if tools:
        _fail("tools", "the model has no chat template to describe tools in")
    if served.prompt_of_question is None or len(plain) != 1 or plain[0]["role"] != "user":
        _fail("messages", "the model has no chat template: expected one user message (it is "
                          "prompted as the run prompts a question)")
    return served.prompt_of_question(plain[0]["content"])


def _tools(body):
    tools, choice = body.get("tools"), body.get("tool_choice", "auto")
    if choice not in (None, "auto", "none"):
        _fail("tool_choice", f"only 'auto' and 'none' are supported, got {choice!r:.60}")
    if tools is None:
        return None
    if not isinstance(tools, list) or not all(
            isinstance(t, dict) and t.get("type") == "function"
            and isinstance(t.get("function"), dict)
            and isinstance(t["function"].get("name"), str) for t in tools):
        _fail("tools", "expected a list of {\"type\": \"function\", \"function\": {\"name\": "
                       "..., \"parameters\": ...}}")
    return tools if choice != "none" else None


# ---- the app ---------------------------------------------------------------------------------

def _error(status: int, message: str, field: str | None, kind="invalid_request_error"):
    from fastapi.responses import JSONResponse

    return JSONResponse(status_code=status, content={"error": {
        "message": message, "type": kind, "param": field, "code": None}})


def _events(chunks):
    async def stream():
        for chunk in chunks:
            yield f"data: {json.dumps(chunk)}\n\n"
        yield "data: [DONE]\n\n"

    return stream()


def _usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def create_app(engine: Engine):
    """The FastAPI app serving `engine`'s policy."""
    try:
        from fastapi import FastAPI, Request as HttpRequest
        from fastapi.responses import StreamingResponse
    except ModuleNotFoundError:
        raise ModuleNotFoundError(MISSING_PACKAGES) from None

    app = FastAPI(title="grpo_jax policy server")
    served = engine.served
    created = int(time.time())

    async def body_of(http: HttpRequest) -> dict:
        try:
            body = await http.json()
        except ValueError:
            _fail("body", "not JSON; expected a JSON object")
        if not isinstance(body, dict):
            _fail("body", f"expected a JSON object, got {type(body).__name__}")
        return body

    async def sample(requests: list[Request]) -> list[list[Completion]]:
        futures = [asyncio.wrap_future(engine.submit(r)) for r in requests]
        try:
            return list(await asyncio.gather(*futures))
        except Exception as err:  # noqa: BLE001  the sampler's failure, as a 500
            raise SamplerError(f"the sampler failed: {type(err).__name__}: "
                               f"{' '.join(str(err).split())}"[:500]) from err

    @app.exception_handler(RequestError)
    async def bad_request(_, err: RequestError):
        return _error(400, str(err), err.field)

    @app.exception_handler(SamplerError)
    async def sampler_failed(_, err: SamplerError):
        return _error(500, str(err), None, kind="server_error")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{
            "id": served.name, "object": "model", "created": created, "owned_by": "grpo_jax",
            "max_model_len": served.context}]}

    @app.post("/v1/completions")
    async def completions(http: HttpRequest):
        body = await body_of(http)
        n, max_tokens, settings, seed, stream, with_ids = _common(body, engine)
        logprobs = body.get("logprobs")
        want_logprobs = type(logprobs) is int and logprobs == 0
        if logprobs is not None and not want_logprobs:
            _fail("logprobs", f"only 0 is supported (each chosen token's log-prob; no top "
                              f"alternatives), got {logprobs!r:.40}")
        stops = _stops(body)
        prompts = _completion_prompts(body.get("prompt"), served.tokenizer)
        requests = [Request(ids, n, _max_tokens(engine, "prompt", ids, max_tokens,
                                                COMPLETIONS_MAX_TOKENS), settings, seed)
                    for ids in prompts]
        results = await sample(requests)
        choices, used = [], 0
        for p, (ids, completions_) in enumerate(zip(prompts, results)):
            prompt_chars = len(served.tokenizer.decode(ids))
            for j, completion in enumerate(completions_):
                text, tokens, logps, pieces, reason = finished_text(served.tokenizer,
                                                                    completion, stops)
                used += len(tokens)
                choice = {"index": p * n + j, "text": text, "finish_reason": reason,
                          "logprobs": None}
                if want_logprobs:
                    offsets = [prompt_chars + sum(map(len, pieces[:i]))
                               for i in range(len(pieces))]
                    choice["logprobs"] = {"tokens": pieces, "token_logprobs": logps,
                                          "top_logprobs": None, "text_offset": offsets}
                if with_ids:
                    choice.update(token_ids=tokens, prompt_token_ids=list(ids))
                choice["_pieces"] = pieces
                choices.append(choice)
        head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
                "created": int(time.time()), "model": served.name, "seed": seed}
        usage = _usage(sum(len(ids) for ids in prompts) * n, used)
        if not stream:
            for choice in choices:
                del choice["_pieces"]
            return {**head, "choices": choices, "usage": usage}
        return StreamingResponse(_events(_completion_chunks(head, choices, body, usage)),
                                 media_type="text/event-stream")

    @app.post("/v1/chat/completions")
    async def chat(http: HttpRequest):
        body = await body_of(http)
        n, max_tokens, settings, seed, stream, with_ids = _common(body, engine)
        want_logprobs = _flag(body, "logprobs")
        if body.get("top_logprobs") not in (None, 0):
            _fail("top_logprobs", "only 0 is supported (no top alternatives), got "
                                  f"{body.get('top_logprobs')!r:.40}")
        format_ = body.get("response_format")
        if format_ is not None and format_ != {"type": "text"}:
            _fail("response_format", f"only {{'type': 'text'}} is supported, got "
                                     f"{format_!r:.60}")
        stops, tools = _stops(body), _tools(body)
        text = chat_prompt(engine, body.get("messages"), tools)
        ids = prompt_ids(served.tokenizer, text)
        request = Request(ids, n, _max_tokens(engine, "messages", ids, max_tokens,
                                              CHAT_MAX_TOKENS), settings, seed)
        (completions_,) = await sample([request])
        choices, used = [], 0
        for j, completion in enumerate(completions_):
            content, tokens, logps, pieces, reason = finished_text(
                served.tokenizer, completion, stops, (CLOSE,) if tools else ())
            used += len(tokens)
            message = {"role": "assistant", "content": content}
            calls = call_objects(content) if tools else []
            if calls:
                message["content"] = content[:content.index(OPEN)] or None
                message["tool_calls"] = [
                    {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                     "function": {"name": name, "arguments": json.dumps(arguments)}}
                    for name, arguments in calls]
                reason = "tool_calls"
            choice = {"index": j, "message": message, "finish_reason": reason,
                      "logprobs": None}
            if want_logprobs:
                choice["logprobs"] = {"content": [
                    {"token": piece, "logprob": logp, "bytes": list(piece.encode("utf-8")),
                     "top_logprobs": []} for piece, logp in zip(pieces, logps)]}
            if with_ids:
                choice.update(token_ids=tokens, prompt_token_ids=list(ids))
            choice["_pieces"] = pieces
            choices.append(choice)
        head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
                "created": int(time.time()), "model": served.name, "seed": seed}
        usage = _usage(len(ids) * n, used)
        if not stream:
            for choice in choices:
                del choice["_pieces"]
            return {**head, "choices": choices, "usage": usage}
        return StreamingResponse(_events(_chat_chunks(head, choices, body, usage)),
                                 media_type="text/event-stream")

    return app


def _completion_prompts(prompt, tokenizer) -> list[list[int]]:
    """The prompts' ids: a string, a list of strings, a list of token ids or a list of them."""
    def ids_of(value, field):
        if isinstance(value, str):
            if not value:
                _fail(field, "expected a non-empty prompt")
            return prompt_ids(tokenizer, value)
        if isinstance(value, list) and value and all(
                isinstance(t, int) and not isinstance(t, bool)
                and 0 <= t < tokenizer.vocab_size for t in value):
            return list(value)
        _fail(field, f"expected a string or a list of token ids in [0, "
                     f"{tokenizer.vocab_size}), got {value!r:.60}")

    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        return [ids_of(p, f"prompt[{i}]") for i, p in enumerate(prompt)]
    return [ids_of(prompt, "prompt")]


def _include_usage(body) -> bool:
    options = body.get("stream_options") or {}
    return isinstance(options, dict) and bool(options.get("include_usage"))


def _completion_chunks(head: dict, choices: list[dict], body, usage) -> list[dict]:
    chunks = []
    for choice in choices:
        pieces = choice["_pieces"]
        for i, piece in enumerate(pieces):
            last = i == len(pieces) - 1
            part: dict[str, Any] = {"index": choice["index"], "text": piece,
                                    "finish_reason": choice["finish_reason"] if last else None,
                                    "logprobs": None}
            if choice["logprobs"] is not None:
                logprobs = choice["logprobs"]
                part["logprobs"] = {"tokens": [piece],
                                    "token_logprobs": [logprobs["token_logprobs"][i]],
                                    "top_logprobs": None,
                                    "text_offset": [logprobs["text_offset"][i]]}
            if "token_ids" in choice:
                part["token_ids"] = [choice["token_ids"][i]]
            chunks.append({**head, "choices": [part]})
        if not pieces:
            chunks.append({**head, "choices": [{"index": choice["index"], "text": "",
                                                "finish_reason": choice["finish_reason"],
                                                "logprobs": None}]})
    if _include_usage(body):
        chunks.append({**head, "choices": [], "usage": usage})
    return chunks


def _chat_chunks(head: dict, choices: list[dict], body, usage) -> list[dict]:
    head = {**head, "object": "chat.completion.chunk"}
    chunks = []
    for choice in choices:
        index = choice["index"]
        chunks.append({**head, "choices": [{"index": index, "delta": {"role": "assistant",
                                                                      "content": ""},
                                            "finish_reason": None, "logprobs": None}]})
        calls = choice["message"].get("tool_calls")
        content = choice["message"]["content"] or ""
        pieces, written = choice["_pieces"], 0
        for i, piece in enumerate(pieces):
            piece = piece[:max(0, len(content) - written)]  # a call's text: in tool_calls
            written += len(piece)
            part = {"index": index, "delta": {"content": piece}, "finish_reason": None,
                    "logprobs": None}
            if choice["logprobs"] is not None:
                part["logprobs"] = {"content": [choice["logprobs"]["content"][i]]}
            if "token_ids" in choice:
                part["token_ids"] = [choice["token_ids"][i]]
            chunks.append({**head, "choices": [part]})
        delta = {"tool_calls": [{"index": k, **call} for k, call in enumerate(calls)]} \
            if calls else {}
        chunks.append({**head, "choices": [{"index": index, "delta": delta, "logprobs": None,
                                            "finish_reason": choice["finish_reason"]}]})
    if _include_usage(body):
        chunks.append({**head, "choices": [], "usage": usage})
    return chunks
