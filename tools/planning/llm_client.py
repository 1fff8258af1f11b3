"""The OpenAI-compatible chat client of the LLM agents: configuration, deadlines, usage and transcripts."""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from pathlib import Path
from typing import Any, Literal

from langchain_core.messages import AIMessage, BaseMessage

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
    """Build the OpenAI-compatible chat model from the run context (the key is read from the environment)."""
    from langchain_openai import ChatOpenAI
    from pydantic import SecretStr

    url = llm_base_url(ctx)
    # langchain sends OpenAI's max_completion_tokens; llama-cpp-python and older servers only read max_tokens
    extra_body = None if "api.openai.com" in url or not url else {"max_tokens": ctx.llm_max_tokens}
    return ChatOpenAI(
        model=ctx.llm_model,
        base_url=url or None,
        api_key=SecretStr(os.environ.get(ctx.llm_api_key_env) or "no-key"),  # keyless local servers accept any key
        temperature=ctx.llm_temperature,
        timeout=ctx.llm_timeout,
        max_retries=0,  # the conversation's model node retries a transient failure (a LangGraph RetryPolicy)
        max_completion_tokens=ctx.llm_max_tokens,
        extra_body=extra_body,
    )


def token_limit_kwargs(ctx: Context, tokens: int) -> dict[str, Any]:
    """Return a request's keyword arguments capping its reply at `tokens` (both names, as `build_chat_model` sends)."""
    url = llm_base_url(ctx)
    extra = {} if "api.openai.com" in url or not url else {"extra_body": {"max_tokens": tokens}}
    return {"max_completion_tokens": tokens, **extra}


def request_deadline(ctx: Context) -> float:
    """Seconds one attempt of a model call may take: `llm_timeout` plus a margin for the client's own timeout."""
    return ctx.llm_timeout + min(5.0, ctx.llm_timeout)


def _is_timeout(exc: BaseException) -> bool:
    return isinstance(exc, TimeoutError) or any("Timeout" in cls.__name__ for cls in type(exc).__mro__)


def http_status(exc: BaseException) -> int | None:
    """Return the HTTP status of a failed request (openai's status_code, or "Error code: NNN" in the text)."""
    status = getattr(exc, "status_code", None)
    if isinstance(status, int):
        return status
    match = re.search(r"Error code: (\d{3})", str(exc))
    return int(match.group(1)) if match else None


def call_model(runnable: Any, messages: list[BaseMessage], deadline: float) -> AIMessage:
    """Invoke `runnable` in a daemon thread and wait at most `deadline` seconds for its reply.

    Raises:
        PlannerFailure: stage "timeout" (deadline passed or a timeout error) or "error" (anything else).
    """
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["reply"] = runnable.invoke(messages)
        except BaseException as exc:  # noqa: BLE001 - every failure is reported to the caller
            box["error"] = exc

    thread = threading.Thread(target=run, name="llm-request", daemon=True)
    thread.start()
    stop_at = time.monotonic() + deadline
    while thread.is_alive() and time.monotonic() < stop_at:
        thread.join(min(0.2, max(0.0, stop_at - time.monotonic())))
        interrupt.check()  # a Ctrl-C does not wait for a slow server's reply
    if thread.is_alive():
        raise PlannerFailure("timeout", f"no reply within {deadline:.1f} s")
    if "error" in box:
        exc = box["error"]
        stage: Stage = "timeout" if _is_timeout(exc) else "error"
        raise PlannerFailure(stage, f"{type(exc).__name__}: {str(exc)[:300]}", status=http_status(exc))
    reply = box.get("reply")
    if not isinstance(reply, AIMessage):
        raise PlannerFailure("error", f"the model returned {type(reply).__name__}, not an AIMessage")
    return reply


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
