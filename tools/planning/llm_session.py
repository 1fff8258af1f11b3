"""One LLM planning step: the bounded tool loop, schema-constrained final answers, parsing, the guard, retries."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from profiling_agent.state import CompressionPlan, Context, QuantEntry, QuantizeChoice, RejectedAnswer
from profiling_agent.tools.planning.llm_client import (
    PlannerFailure,
    Stage,
    Transcript,
    add_usage,
    call_model,
    empty_usage,
    message_text,
    record_reply,
    request_deadline,
)
from profiling_agent.tools.planning.llm_repair import Repair, answer_key, repeated_reason
from profiling_agent.tools.planning.plan_guard import GuardConfig, check_plan
from profiling_agent.tools.planning.plan_parse import parse_plan_text
from profiling_agent.tools.planning.structured import ModeFinder, plan_schema, refuses_format, response_format

RETRY_GUARD = (
    "Your plan was rejected:\n{reasons}\nFix every problem{tools} and answer with the corrected JSON plan only."
)
TOOLS_HELP = " (call the tools if that helps)"
RETRY_PARSE = (
    "Your answer could not be used: {reasons}\nAnswer with exactly one JSON object in the required plan format: no "
    "code, no comments."
)
CUT_OFF = (
    "the answer was cut off at the token limit ({tokens} tokens): give a shorter plan with one-line justifications"
)
FORCE_FINAL = "The tool budget is used up. Answer now with the final JSON plan only, without calling tools."
TOOL_BUDGET_SPENT = "error: tool budget exhausted; no more tool calls this step"
MAX_ANSWER_KEPT = 600  # characters of a rejected answer kept in the fallback record
MAX_REFUSED_IN_HISTORY = 1200  # characters of a refused answer the retry's conversation keeps
STEP_BUDGET_REQUESTS = 4  # a planning step may take at most this many request deadlines in all


def _shortened(reply: AIMessage, text: str) -> AIMessage:
    """Return the refused answer as the retry's conversation keeps it: at most MAX_REFUSED_IN_HISTORY characters.

    A small model that rambles to the token cap would otherwise carry thousands of tokens into every retry,
    and a server with an 8k context refuses the second retry outright (seen with SmolLM2 on llama-cpp-python).
    """
    if len(text) <= MAX_REFUSED_IN_HISTORY:
        return reply
    cut = len(text) - MAX_REFUSED_IN_HISTORY
    return AIMessage(content=f"{text[:MAX_REFUSED_IN_HISTORY]}\n[... {cut} more characters of this refused answer]")


class _Rejected(Exception):
    def __init__(self, stage: Stage, reasons: list[str]):
        super().__init__("; ".join(reasons))
        self.stage, self.reasons = stage, reasons


def apply_quantize_choice(
    plan: dict[str, Any], quantize: QuantizeChoice, fallback_plan: CompressionPlan
) -> tuple[dict[str, Any], list[str]]:
    """Make a parsed plan respect the objective's quantization choice.

    With quantize "none" the LLM's quantization entries are dropped; otherwise, when the LLM left quantization
    out, the fallback plan's entries (or one "all" entry of the chosen dtype) are added. The LLM's own dtype
    choices are kept when it did quantize.
    """
    entries = plan.get("quantization")
    if not isinstance(entries, list):
        return plan, []
    if quantize == "none":
        if entries:
            return {**plan, "quantization": []}, ["dropped the quantization entries: the objective disables it"]
        return plan, []
    if entries:
        return plan, []
    added = [q.model_dump() for q in fallback_plan.quantization]
    added = added or [QuantEntry(layer="all", dtype=quantize).model_dump()]
    return {**plan, "quantization": added}, [f"added the objective's {quantize} quantization the plan left out"]


def without_tool_turns(messages: list[BaseMessage]) -> list[BaseMessage]:
    """Rewrite tool calls and tool results as plain turns, for a request that carries no tools.

    A schema-constrained request cannot also offer tools (OpenAI-compatible servers pick one decoding mode),
    and some servers refuse a history of tool calls without tool definitions; the facts stay in the history.
    """
    out: list[BaseMessage] = []
    for message in messages:
        if isinstance(message, AIMessage) and (message.tool_calls or message.invalid_tool_calls):
            calls = ", ".join(f"{c.get('name')}({json.dumps(c.get('args') or {})})" for c in message.tool_calls)
            text = message_text(message)
            out.append(AIMessage(content=(text + "\n" if text else "") + f"[I called the tools: {calls}]"))
        elif isinstance(message, ToolMessage):
            out.append(HumanMessage(content=f"[tool {message.name} returned]\n{message_text(message)}"))
        else:
            out.append(message)
    return out


@dataclass
class Session:
    """One planning step: the tool loop, schema-constrained final answers, parsing, the guard and retries.

    The model may call tools until it answers in text. A text answer that parses and passes the guard is the
    plan; otherwise the retry (and any answer forced after the tool budget) is requested with the server's
    schema-constrained mode, which `finder` learns from the server's answers. With `repair`, a refused answer's
    repair turn shows the deterministic proposal inline with the numbers of both plans; an answer that repeats a
    refused plan ends the step. A model that called tools keeps them on its repair turns while tool rounds are left.
    """

    model: Any
    tools: list[Any]
    ctx: Context
    transcript: Transcript
    profile: dict[str, Any]
    quantize: QuantizeChoice
    fallback_plan: CompressionPlan
    guard: GuardConfig = field(default_factory=GuardConfig)
    usage: dict[str, int] = field(default_factory=empty_usage)
    tool_errors: list[dict[str, str]] = field(default_factory=list)
    finder: ModeFinder = field(default_factory=ModeFinder)
    repair: Repair | None = None

    def __post_init__(self) -> None:
        self.by_name = {t.name: t for t in self.tools}
        self.deadline = request_deadline(self.ctx)
        self.bound, self.final, self.has_tools = self._bind()
        caps = {"structured": self.guard.max_ratio_structured, "head": self.guard.max_ratio_head, "block": 1.0}
        groups = self.profile.get("groups") or []
        linears = [str(r["name"]) for r in self.profile.get("layers") or [] if "Linear" in str(r.get("type", ""))]
        paying = self.guard.tokens.paying() if self.guard.tokens is not None else []
        self.schema = plan_schema(
            groups,
            self.guard.allowed_dtypes,
            caps,
            self.guard.min_ratio,
            linears,
            [r.rate for r in paying if r.rate is not None],
            [r.schedule for r in paying if r.rate is None],
        )
        self.ratios: dict[str, float] = {}  # the accepted plan's ratio per group
        self.refused_estimate: dict[str, float] = {}  # the last refused plan's predicted reduction
        self.sent_back = 0  # answers refused before the accepted one

    def _bind(self) -> tuple[Any, Any, bool]:
        if not self.tools or self.ctx.llm_tool_rounds <= 0:
            return self.model, self.model, False
        try:
            bound = self.model.bind_tools(self.tools)
        except NotImplementedError:
            self.transcript.write("note", message="the model does not support tools; planning without them")
            return self.model, self.model, False
        try:
            final = self.model.bind_tools(self.tools, tool_choice="none")
        except (NotImplementedError, TypeError, ValueError):
            final = bound
        return bound, final, True

    def _run_tools(self, reply: AIMessage) -> list[ToolMessage]:
        out = []
        for n, call in enumerate(reply.tool_calls):
            name, args, call_id = call.get("name", ""), call.get("args") or {}, call.get("id") or f"call_{n}"
            self.transcript.write("tool_call", name=name, args=args, id=call_id)
            tool = self.by_name.get(name)
            if tool is None:
                content = f"error: unknown tool {name!r}; available tools: {', '.join(self.by_name)}"
                self.tool_errors.append({"name": str(name)[:80], "error": "unknown tool: refused, nothing was run"})
            else:
                try:
                    content = str(tool.invoke(args))
                except Exception as exc:  # noqa: BLE001 - bad arguments go back to the LLM
                    content = f"error: {type(exc).__name__}: {str(exc)[:400]}"
                    self.tool_errors.append({"name": str(name)[:80], "error": content[7:207]})
            self.transcript.write("tool_result", name=name, id=call_id, content=content)
            out.append(ToolMessage(content=content, tool_call_id=call_id, name=name or "unknown"))
        for n, call in enumerate(getattr(reply, "invalid_tool_calls", []) or []):
            call_id = call.get("id") or f"invalid_{n}"
            content = f"error: the arguments of {call.get('name')!r} are not valid JSON: {call.get('error') or ''}"
            self.tool_errors.append({"name": str(call.get("name"))[:80], "error": "arguments are not valid JSON"})
            self.transcript.write("tool_result", name=call.get("name"), id=call_id, content=content)
            out.append(ToolMessage(content=content, tool_call_id=call_id, name=call.get("name") or "unknown"))
        return out

    def _accept(self, text: str) -> tuple[CompressionPlan, dict[str, float]]:
        self.refused_estimate = {}
        try:
            raw, notes = parse_plan_text(text)
        except ValueError as exc:
            self.transcript.write("parse_error", reason=str(exc))
            raise _Rejected("parse", [str(exc)]) from exc
        raw, policy = apply_quantize_choice(raw, self.quantize, self.fallback_plan)
        verdict = check_plan(
            raw,
            self.profile.get("groups") or [],
            self.profile.get("protected") or [],
            self.profile.get("group_costs") or {},
            self.guard,
            layers=self.profile.get("layers"),
        )
        self.transcript.write("guard", **verdict.to_dict(), notes=notes + policy)
        if not verdict.ok or verdict.plan is None:
            self.refused_estimate = dict(verdict.estimate)
            raise _Rejected("guard", verdict.reasons)
        self.ratios = dict(verdict.ratios)
        return verdict.plan, verdict.estimate

    def _request(self, messages: list[BaseMessage], constrained: bool, forced: bool, left: float) -> AIMessage:
        """Send one request; a constrained one uses the current structured mode, stepping past refused modes."""
        while True:
            fmt = response_format(self.finder.mode, self.schema) if constrained else None
            if fmt is None:
                return call_model(self.final if (forced or constrained) else self.bound, messages, left)
            self.transcript.write("request", structured=self.finder.mode)
            try:
                return call_model(self.model.bind(response_format=fmt), without_tool_turns(messages), left)
            except PlannerFailure as failure:
                if failure.stage != "error" or not refuses_format(failure.status, failure.reason):
                    raise
                mode = self.finder.mode
                if not self.finder.give_up(f"refused by the server: {failure.reason}"):
                    raise
                self.transcript.write("structured", refused=mode, reason=failure.reason[:300], next=self.finder.mode)

    def _repair_text(self, rej: _Rejected, keep_tools: bool) -> str:
        """Return the repair turn: the proposal inline when there is one, else the reasons alone."""
        shown = None
        if self.repair is not None:
            shown = self.repair.message(rej.reasons, self.refused_estimate, keep_tools, parsed=rej.stage != "parse")
        if shown is not None:
            return shown
        reasons = "\n".join(f"- {r}" for r in rej.reasons)
        if rej.stage == "parse":
            return RETRY_PARSE.format(reasons=reasons)
        return RETRY_GUARD.format(reasons=reasons, tools=TOOLS_HELP if keep_tools else "")

    def run(self, messages: list[BaseMessage]) -> tuple[CompressionPlan, dict[str, float]]:
        """Talk to the model until it gives a plan the guard accepts (returned with its estimate), or raise."""
        rounds, forced = 0, False
        rejected: list[RejectedAnswer] = []
        refused: dict[str, str] = {}  # answer_key -> the first reason it was refused for
        constrained = not self.has_tools  # without tools, every answer is the final one
        budget = STEP_BUDGET_REQUESTS * self.deadline
        stop_at = time.monotonic() + budget
        while True:
            left = min(stop_at - time.monotonic(), self.deadline)
            if left <= 0:  # a server that answers every request just in time must not stall the run forever
                raise PlannerFailure("timeout", f"the planning step took longer than {budget:.1f} s", rejected)
            try:
                reply = self._request(messages, constrained, forced, left)
            except PlannerFailure as failure:
                if "LengthFinishReasonError" in failure.reason:  # a constrained answer hit the token cap
                    reason = CUT_OFF.format(tokens=self.ctx.llm_max_tokens)
                    rejected.append(
                        {"stage": "parse", "reasons": [reason], "answer": "", "structured": self.finder.mode}
                    )
                    self.transcript.write("parse_error", reason=reason)
                    if len(rejected) > self.ctx.llm_retries:
                        raise PlannerFailure(
                            "parse", f"{len(rejected)} invalid answers; last: {reason}", rejected
                        ) from None
                    messages.append(HumanMessage(content=RETRY_PARSE.format(reasons=f"- {reason}")))
                    continue
                if failure.stage == "timeout" and stop_at - time.monotonic() < self.deadline:
                    raise PlannerFailure(
                        "timeout", f"the planning step took longer than {budget:.1f} s", rejected
                    ) from None
                raise PlannerFailure(failure.stage, failure.reason, rejected) from None
            mode = self.finder.mode if constrained else "off"
            add_usage(self.usage, reply)
            record_reply(self.transcript, reply)
            messages.append(reply)
            if reply.tool_calls or getattr(reply, "invalid_tool_calls", None):
                if forced:
                    raise PlannerFailure("tool_loop", f"still calling tools after {rounds} tool rounds", rejected)
                if rounds >= self.ctx.llm_tool_rounds:
                    messages += [
                        ToolMessage(
                            content=TOOL_BUDGET_SPENT,
                            tool_call_id=c.get("id") or f"call_{n}",
                            name=c.get("name") or "unknown",
                        )
                        for n, c in enumerate([*reply.tool_calls, *reply.invalid_tool_calls])
                    ]
                    messages.append(HumanMessage(content=FORCE_FINAL))
                    self.transcript.write("prompt", role="human", content=FORCE_FINAL)
                    forced = constrained = True
                    continue
                messages += self._run_tools(reply)
                rounds += 1
                continue
            text = message_text(reply)
            try:
                plan = self._accept(text)
            except _Rejected as rej:
                rejected.append(
                    {"stage": rej.stage, "reasons": rej.reasons, "answer": text[:MAX_ANSWER_KEPT], "structured": mode}
                )
                if rej.stage == "guard" and mode != "off":
                    self.finder.worked()  # the answer parsed: the server honoured the schema
                if rej.stage == "parse" and mode != "off" and self.finder.give_up(f"ignored: {rej.reasons[0]}"):
                    self.transcript.write("structured", ignored=mode, next=self.finder.mode)
                # a plan the guard refused is the same plan under any mode; an unusable answer under another mode
                # is the server ignoring that mode, which the finder steps past
                key = answer_key(text) if rej.stage == "guard" else f"{mode} {answer_key(text)}"
                if key in refused:  # the same plan again: a third refusal would teach the model nothing
                    self.transcript.write("repeated", reason=refused[key])
                    raise PlannerFailure(rej.stage, repeated_reason(refused[key]), rejected) from None
                refused[key] = rej.reasons[0]
                if len(rejected) > self.ctx.llm_retries:
                    raise PlannerFailure(
                        rej.stage, f"{len(rejected)} invalid answers; last: {rej.reasons[0]}", rejected
                    ) from None
                messages[-1] = _shortened(reply, text)  # a rambling refused answer must not fill the context
                keep_tools = self.has_tools and not forced and 0 < rounds < self.ctx.llm_tool_rounds
                retry = self._repair_text(rej, keep_tools)
                messages.append(HumanMessage(content=retry))
                self.transcript.write("prompt", role="human", content=retry)
                constrained = not keep_tools
                continue
            if mode != "off":
                self.finder.worked()
            self.sent_back = len(rejected)
            return plan
