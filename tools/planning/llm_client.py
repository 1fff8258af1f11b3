"""The OpenAI-compatible chat client of the LLM agents: configuration, deadlines, usage and transcripts."""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, message_chunk_to_message
from langchain_core.messages.tool import invalid_tool_call
from pydantic import SecretStr

from profiling_agent.state import Context, Fallback, LLMStep, RejectedAnswer
from profiling_agent.tools import interrupt, run_layout
from profiling_agent.tools.planning.llm_config import describe_endpoint, llm_base_url

logger = logging.getLogger(__name__)

Stage = Literal["parse", "guard", "timeout", "error", "tool_loop"]


class PlannerFailure(Exception):
    """The LLM could not deliver a valid plan; carries the fallback stage and the rejected answers."""

    def __init__(
        self, stage: Stage, reason: str, rejected: list[RejectedAnswer] | None = None, status: int | None = None
    ):
        super().__init__(reason)
        self.stage, self.reason, self.rejected, self.status = stage, reason, list(rejected or []), status


# ---------------------------------------------------------------- transcript


class Transcript:
    """Append-only JSON-lines log of one planning step (prompts, replies, tool calls, guard verdicts)."""

    def __init__(self, path: Path | None, rel: str | None, iteration: int):
        self.path, self.rel, self.iteration = path, rel, iteration

    @classmethod
    def open(cls, run_path: str, iteration: int) -> Transcript:
        """Open `run_path/iter_NN/llm_transcript.jsonl` for appending (`start` empties it for a new conversation)."""
        if not run_path:
            return cls(None, None, iteration)
        rel = f"{run_layout.iteration_name(iteration)}/{run_layout.LLM_TRANSCRIPT}"
        path = Path(run_path) / rel
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
        except OSError as exc:
            logger.warning("LLM transcript disabled: %s", exc)
            return cls(None, None, iteration)
        return cls(path, rel, iteration)

    def start(self) -> None:
        """Empty the transcript: a new conversation of this round begins (a resumed one keeps what was said)."""
        if self.path is None:
            return
        try:
            self.path.write_text("", encoding="utf-8")
        except OSError as exc:
            logger.warning("LLM transcript disabled: %s", exc)
            self.path = None

    def write(self, event: str, **data: Any) -> None:
        """Append one event; a failing disk never stops planning."""
        if self.path is None:
            return
        record = {"time": round(time.time(), 3), "iteration": self.iteration, "event": event, **data}
        try:
            with self.path.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps(record, default=str) + "\n")
        except OSError as exc:
            logger.warning("LLM transcript write failed: %s", exc)
            self.path = None


def message_text(message: BaseMessage) -> str:
    """Return a message's text (string content, or the text blocks of a list content)."""
    content = message.content
    if isinstance(content, str):
        return content
    parts = [b.get("text", "") if isinstance(b, dict) else str(b) for b in content or []]
    return "".join(p for p in parts if isinstance(p, str))


def empty_usage() -> dict[str, int]:
    """Return a zeroed token-usage counter."""
    return {"calls": 0, "input_tokens": 0, "output_tokens": 0, "total_tokens": 0}


def add_usage(total: dict[str, int], reply: AIMessage) -> None:
    """Add one reply's `usage_metadata` (when the server reported it) to `total`, in place."""
    total["calls"] = total.get("calls", 0) + 1
    usage = getattr(reply, "usage_metadata", None) or {}
    for key in ("input_tokens", "output_tokens", "total_tokens"):
        value = usage.get(key) if isinstance(usage, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            total[key] = total.get(key, 0) + value


def record_reply(transcript: Transcript, reply: AIMessage) -> None:
    """Write one model reply, with its token usage when reported, to the transcript."""
    usage = getattr(reply, "usage_metadata", None)
    transcript.write(
        "reply",
        content=message_text(reply),
        tool_calls=[{"name": c.get("name"), "args": c.get("args"), "id": c.get("id")} for c in reply.tool_calls],
        invalid_tool_calls=[dict(c) for c in getattr(reply, "invalid_tool_calls", []) or []],
        usage=dict(usage) if usage else None,
    )


# ---------------------------------------------------------------- calling the model


def build_chat_model(ctx: Context) -> Any:
    """Build the OpenAI-compatible chat model from the run context (the key is read from the environment).

    Replies are streamed (`call_model`), with the token usage asked for in the stream's last chunk; the HTTP
    client's own read timeout is only a backstop behind `request_limits`.
    """
    from langchain_openai import ChatOpenAI  # lazy: the openai client, which only an LLM planner's run needs

    url = llm_base_url(ctx)
    # langchain sends OpenAI's max_completion_tokens; llama-cpp-python and older servers only read max_tokens
    extra_body = None if "api.openai.com" in url or not url else {"max_tokens": ctx.llm_max_tokens}
    limits = request_limits(ctx)
    chat = ChatOpenAI(
        model=ctx.llm_model,
        base_url=url or None,
        api_key=SecretStr(os.environ.get(ctx.llm_api_key_env) or "no-key"),  # keyless local servers accept any key
        temperature=ctx.llm_temperature,
        timeout=max(limits.first_token, limits.idle) + 5.0,  # the longest gap between two reads of a stream
        max_retries=0,  # the conversation's model node retries a transient failure (a LangGraph RetryPolicy)
        max_completion_tokens=ctx.llm_max_tokens,
        extra_body=extra_body,
        stream_usage=True,
    )
    # a streamed schema-constrained reply goes through openai's beta helpers, whose first use imports them (4 s
    # on a busy 2-core machine, measured 2026-11-28): paid here, not within the first request's limits
    getattr(getattr(chat, "root_client", None), "beta", None)
    return chat


def token_limit_kwargs(ctx: Context, tokens: int) -> dict[str, Any]:
    """Return a request's keyword arguments capping its reply at `tokens` (both names, as `build_chat_model` sends)."""
    url = llm_base_url(ctx)
    extra = {} if "api.openai.com" in url or not url else {"extra_body": {"max_tokens": tokens}}
    return {"max_completion_tokens": tokens, **extra}


@dataclass(frozen=True)
class RequestLimits:
    """How long one streamed request may take: to its first token, between two tokens, and in all."""

    first_token: float  # seconds until the first token (the server reading the prompt: minutes on a small CPU)
    idle: float  # seconds a reply may go without a new token once it has started
    total: float | None = None  # seconds the whole request may take (None: no total limit)


def request_limits(ctx: Context) -> RequestLimits:
    """Return the run's request limits: --llm-first-token-timeout, --llm-idle-timeout, --llm-timeout (0: none)."""
    total = ctx.llm_timeout if ctx.llm_timeout > 0 else None
    return RequestLimits(first_token=ctx.llm_first_token_timeout, idle=ctx.llm_idle_timeout, total=total)


def _is_timeout(exc: BaseException) -> bool:
    return isinstance(exc, TimeoutError) or any("Timeout" in cls.__name__ for cls in type(exc).__mro__)


def http_status(exc: BaseException) -> int | None:
    """Return the HTTP status of a failed request (openai's status_code, or "Error code: NNN" in the text)."""
    status = getattr(exc, "status_code", None)
    if isinstance(status, int):
        return status
    match = re.search(r"Error code: (\d{3})", str(exc))
    return int(match.group(1)) if match else None


def _progress(chunk: Any) -> bool:
    """Return True for a streamed chunk that carries part of the reply (not the bare role that opens a stream)."""
    if not isinstance(chunk, BaseMessage):
        return True
    finish = (getattr(chunk, "response_metadata", None) or {}).get("finish_reason")
    calls = getattr(chunk, "tool_call_chunks", None) or getattr(chunk, "tool_calls", None)
    return bool(message_text(chunk) or calls or getattr(chunk, "usage_metadata", None) or finish)


def overdue(limits: RequestLimits, elapsed: float, since_token: float | None, tokens: int) -> str | None:
    """Return why a streamed request is cut now, or None while it may go on.

    Args:
        limits: The request's limits.
        elapsed: Seconds since the request was sent.
        since_token: Seconds since the last chunk that carried part of the reply (None: none yet).
        tokens: Chunks with part of the reply received so far.
    """
    if limits.total is not None and elapsed > limits.total:
        return f"no reply within {limits.total:g} s (--llm-timeout, the whole request), {tokens} chunks received"
    if since_token is None and elapsed > limits.first_token:
        return f"no first token within {limits.first_token:g} s (--llm-first-token-timeout)"
    if since_token is not None and since_token > limits.idle:
        return f"the reply stalled: no new token for {limits.idle:g} s after {tokens} chunks (--llm-idle-timeout)"
    return None


def joined(chunks: list[Any]) -> AIMessage:
    """Join a streamed reply's chunks into one AIMessage (tool-call fragments become tool calls)."""
    if len(chunks) == 1 and isinstance(chunks[0], AIMessage) and not isinstance(chunks[0], AIMessageChunk):
        return chunks[0]  # a chat model that does not stream answered whole
    if not chunks or not all(isinstance(c, AIMessageChunk) for c in chunks):
        kinds = sorted({type(c).__name__ for c in chunks}) or ["nothing"]
        raise PlannerFailure("error", f"the model streamed {', '.join(kinds)}, not an AIMessage")
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged = merged + chunk
    message = message_chunk_to_message(merged)
    if not isinstance(message, AIMessage):
        raise PlannerFailure("error", f"the model returned {type(message).__name__}, not an AIMessage")
    message = _strict_tool_calls(message, merged.tool_call_chunks)
    if (message.response_metadata or {}).get("finish_reason") == "length":
        raise PlannerFailure("error", "LengthFinishReasonError: the reply reached the token limit (finish_reason)")
    return message


def _strict_tool_calls(message: AIMessage, chunks: list[Any]) -> AIMessage:
    """Return `message` with tool calls whose streamed arguments are not whole JSON objects made invalid.

    Joining chunks parses arguments leniently (a cut-off `{"plan_json": ` becomes `{}`); a reply read whole
    would have had them refused, so they are refused here too.
    """
    calls, invalid = [], list(message.invalid_tool_calls)
    by_id = {c.get("id"): c for c in message.tool_calls}
    for chunk in chunks:
        raw = chunk.get("args") or ""
        call = by_id.get(chunk.get("id"))
        try:
            args = json.loads(raw) if raw.strip() else {}
        except ValueError:
            args = None
        if call is not None and isinstance(args, dict):
            calls.append({**call, "args": args})
        elif call is not None:
            error = "the arguments are not a whole JSON object"
            invalid.append(invalid_tool_call(name=call.get("name"), args=raw, id=call.get("id"), error=error))
    if not chunks or len(calls) + len(invalid) < len(message.tool_calls) + len(message.invalid_tool_calls):
        return message  # chunks without ids (a model that answered whole): keep what langchain parsed
    return message.model_copy(update={"tool_calls": calls, "invalid_tool_calls": invalid})


def call_model(runnable: Any, messages: list[BaseMessage], limits: RequestLimits) -> AIMessage:
    """Stream `runnable`'s reply in a daemon thread; cut it when it is overdue (`overdue`) or on a Ctrl-C.

    Raises:
        PlannerFailure: stage "timeout" (a limit passed, or a timeout error) or "error" (anything else).
    """
    box: dict[str, Any] = {"chunks": [], "last": None, "tokens": 0, "stop": False}

    def run() -> None:
        try:
            for chunk in runnable.stream(messages):
                box["chunks"].append(chunk)
                if _progress(chunk):
                    box["last"], box["tokens"] = time.monotonic(), box["tokens"] + 1
                if box["stop"]:
                    break  # the caller cut the reply: closing the stream tells the server the client has gone
        except BaseException as exc:  # noqa: BLE001 - every failure is reported to the caller
            box["error"] = exc

    thread = threading.Thread(target=run, name="llm-request", daemon=True)
    started = time.monotonic()
    thread.start()
    try:
        while thread.is_alive():
            thread.join(0.2)
            interrupt.check()  # a Ctrl-C does not wait for a slow server's reply
            now, last = time.monotonic(), box["last"]
            cut = overdue(limits, now - started, None if last is None else now - last, box["tokens"])
            if cut is not None and thread.is_alive():
                raise PlannerFailure("timeout", cut)
    finally:
        box["stop"] = True
    if "error" in box:
        exc = box["error"]
        stage: Stage = "timeout" if _is_timeout(exc) else "error"
        raise PlannerFailure(stage, f"{type(exc).__name__}: {str(exc)[:300]}", status=http_status(exc))
    return joined(box["chunks"])


# ---------------------------------------------------------------- an endpoint that never answered


class LLMUnreachable(RuntimeError):
    """`--planner llm` was asked for explicitly and the endpoint never answered (a fault of the machine or server)."""


CONFIG_FAULTS = ("ConnectionError", "ConnectError", "Connection refused", "AuthenticationError", "NotFoundError")
CONFIG_STATUS = re.compile(r"Error code: (401|403|404)\b")


def never_reached(fallback: Fallback | None, ctx: Context) -> Exception:
    """Return the one-line error for an explicit `--planner llm` whose endpoint never answered.

    A configuration fault (nothing listening, a wrong URL or model: 404, a refused key: 401/403) is a ValueError
    (exit 2); a server that hangs or answers garbage is LLMUnreachable (exit 1).
    """
    stage = fallback.stage if fallback is not None else "error"
    reason = " ".join(((fallback.reason if fallback is not None else "") or "no reply").split())[:200]
    where = describe_endpoint(ctx)
    if (
        fallback is not None
        and stage == "error"
        and (any(word in reason for word in CONFIG_FAULTS) or CONFIG_STATUS.search(reason))
    ):
        return ValueError(
            f"--planner llm: the LLM {where} could not be used ({reason}); check --llm-base-url, --llm-model and "
            f"${ctx.llm_api_key_env}, or use --planner auto to fall back to the deterministic planner"
        )
    return LLMUnreachable(
        f"--planner llm: the LLM {where} never gave a usable reply ({stage}: {reason}); "
        "use --planner auto to fall back to the deterministic planner"
    )


def llm_console_note(info: LLMStep) -> str:
    """Return the console's bracketed note on an LLM step; a structured mode is named only when it was used."""
    usage, found = info.usage, info.structured
    if not usage.get("calls"):
        return f"[LLM: no reply; transcript {info.transcript}]"
    mode = found.get("mode") if found.get("confirmed") else None
    shown = f"structured output {mode}" if mode and mode != "off" else "free-text answers (no structured output)"
    tokens = usage.get("total_tokens", 0)
    return f"[LLM: {usage['calls']} calls, {tokens} tokens, {shown}; transcript {info.transcript}]"
