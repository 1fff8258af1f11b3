"""What one LLM planning step needs beside its messages: the model and tools bound, requests, the guard, repairs."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from profiling_agent.state import (
    CompressionPlan,
    Context,
    PlannerProfile,
    QuantEntry,
    QuantizeChoice,
    StructuredFacts,
    StructuredMode,
)
from profiling_agent.tools.planning.alternatives import Offer, without_floor
from profiling_agent.tools.planning.llm_client import (
    PlannerFailure,
    Stage,
    Transcript,
    call_model,
    message_text,
    request_limits,
    token_limit_kwargs,
)
from profiling_agent.tools.planning.llm_repair import Repair
from profiling_agent.tools.planning.plan_guard import GuardConfig, check_plan
from profiling_agent.tools.planning.plan_parse import parse_plan_text
from profiling_agent.tools.planning.resize import Resize, Resized
from profiling_agent.tools.planning.structured import (
    ModeFinder,
    answer_token_limit,
    plan_schema,
    refuses_format,
    response_format,
)

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


def shortened(reply: BaseMessage, text: str) -> BaseMessage:
    """Return the refused answer as the retry's conversation keeps it: at most MAX_REFUSED_IN_HISTORY characters.

    A small model that rambles to the token cap would otherwise carry thousands of tokens into every retry,
    and a server with an 8k context refuses the second retry outright (seen with SmolLM2 on llama-cpp-python).
    """
    if len(text) <= MAX_REFUSED_IN_HISTORY:
        return reply
    cut = len(text) - MAX_REFUSED_IN_HISTORY
    short = f"{text[:MAX_REFUSED_IN_HISTORY]}\n[... {cut} more characters of this refused answer]"
    return AIMessage(content=short, id=reply.id)  # the same id: it replaces the reply in the conversation's state


class Rejected(Exception):
    """An answer the parser or the guard refused: the stage, the reasons and the refused plan's predicted reduction."""

    def __init__(
        self,
        stage: Stage,
        reasons: list[str],
        estimate: dict[str, float] | None = None,
        ratios: dict[str, float] | None = None,
    ):
        super().__init__("; ".join(reasons))
        self.stage, self.reasons, self.estimate = stage, reasons, dict(estimate or {})
        self.ratios = dict(ratios or {})  # the refused plan's ratio per group (empty: refused before sizing)


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
class Conversation:
    """What the conversation's nodes read beside its state: the model and tools, the guard, the transcript.

    It is the subgraph's run context (never checkpointed): a resume builds it again from the same round.
    Tools are bound when `ctx.llm_tool_rounds` allows them; a constrained request uses the structured mode
    `ModeFinder` learnt from the server, and a refused answer's repair turn shows the deterministic proposal.
    """

    model: Any
    tools: list[Any]
    ctx: Context
    transcript: Transcript
    profile: PlannerProfile
    quantize: QuantizeChoice
    fallback_plan: CompressionPlan
    guard: GuardConfig = field(default_factory=GuardConfig)
    repair: Repair | None = None
    known_mode: StructuredMode | None = None  # a mode an earlier round of this run confirmed
    offer: Offer = field(default_factory=Offer)  # the labelled alternatives the prompt offers
    tools_off: str | None = None  # why an earlier round stopped offering tools (the model cannot use them)
    resize: Resize | None = None  # sizes a refused plan's groups to the goal, for the repair turn

    def __post_init__(self) -> None:
        self.notes: list[str] = []  # written to the transcript when the conversation starts
        self.by_name = {t.name: t for t in self.tools}
        self.limits = request_limits(self.ctx)
        self.bound, self.final, self.has_tools = self._bind()
        caps = {"structured": self.guard.max_ratio_structured, "head": self.guard.max_ratio_head, "block": 1.0}
        groups = [(g.name, g.kind) for g in self.profile.rows]
        linears = [r.name for r in self.profile.layers or [] if r.is_linear()]
        paying = self.guard.tokens.paying() if self.guard.tokens is not None else []
        self.schema = plan_schema(
            groups,
            self.guard.allowed_dtypes,
            caps,
            self.guard.min_ratio,
            linears,
            [r.rate for r in paying if r.rate is not None],
            [r.schedule for r in paying if r.rate is None],
            self.offer.labels(),
        )
        # every reply is capped at the longest plan the schema allows (--llm-max-tokens caps it further)
        self.max_tokens = min(self.ctx.llm_max_tokens, answer_token_limit(self.schema))
        self.limit = token_limit_kwargs(self.ctx, self.max_tokens)

    def _bind(self) -> tuple[Any, Any, bool]:
        if self.tools_off:
            self.notes.append(f"no tools offered: an earlier round showed the model cannot use them ({self.tools_off})")
        if not self.tools or self.ctx.llm_tool_rounds <= 0 or self.tools_off:
            return self.model, self.model, False
        try:
            bound = self.model.bind_tools(self.tools)
        except NotImplementedError:
            self.notes.append("the model does not support tools; planning without them")
            return self.model, self.model, False
        try:
            final = self.model.bind_tools(self.tools, tool_choice="none")
        except (NotImplementedError, TypeError, ValueError):
            final = bound
        return bound, final, True

    def finder(self, record: StructuredFacts | None) -> ModeFinder:
        """Return the structured-mode finder as the conversation's state left it (`record`: its last record)."""
        return ModeFinder.restored(self.ctx.llm_structured, self.known_mode, record)

    def run_tools(self, reply: AIMessage) -> tuple[list[ToolMessage], list[dict[str, str]]]:
        """Run the reply's tool calls; return the tool messages and the calls refused or failed."""
        out, errors = [], []
        for n, call in enumerate(reply.tool_calls):
            name, args, call_id = call.get("name", ""), call.get("args") or {}, call.get("id") or f"call_{n}"
            self.transcript.write("tool_call", name=name, args=args, id=call_id)
            tool = self.by_name.get(name)
            if tool is None:
                content = f"error: unknown tool {name!r}; available tools: {', '.join(self.by_name)}"
                errors.append({"name": str(name)[:80], "error": "unknown tool: refused, nothing was run"})
            else:
                try:
                    content = str(tool.invoke(args))
                except Exception as exc:  # noqa: BLE001 - bad arguments go back to the LLM
                    content = f"error: {type(exc).__name__}: {str(exc)[:400]}"
                    errors.append({"name": str(name)[:80], "error": content[7:207]})
            self.transcript.write("tool_result", name=name, id=call_id, content=content)
            out.append(ToolMessage(content=content, tool_call_id=call_id, name=name or "unknown"))
        for n, call in enumerate(getattr(reply, "invalid_tool_calls", []) or []):
            call_id = call.get("id") or f"invalid_{n}"
            content = f"error: the arguments of {call.get('name')!r} are not valid JSON: {call.get('error') or ''}"
            errors.append({"name": str(call.get("name"))[:80], "error": "arguments are not valid JSON"})
            self.transcript.write("tool_result", name=call.get("name"), id=call_id, content=content)
            out.append(ToolMessage(content=content, tool_call_id=call_id, name=call.get("name") or "unknown"))
        return out, errors

    def accept(self, text: str) -> tuple[CompressionPlan, dict[str, float], dict[str, float], dict[str, str] | None]:
        """Parse and guard an answer; return the plan, its predicted reduction, its ratio per group and its choice.

        An answer that chooses an offered alternative by label stands for that plan (edited by entries beside the
        choice); the choice ({"label", "why"}) is None for an answer that writes its own plan.

        Raises:
            Rejected: the answer is not a plan (stage "parse") or the guard refused it (stage "guard").
        """
        choice = None
        try:
            chosen = self.offer.resolve(text)
            if chosen is not None:
                raw, notes, choice = chosen
                self.transcript.write("choice", **choice)
            else:
                raw, notes = parse_plan_text(text)
        except ValueError as exc:
            self.transcript.write("parse_error", reason=str(exc))
            raise Rejected("parse", [str(exc)]) from exc
        raw, policy = apply_quantize_choice(raw, self.quantize, self.fallback_plan)
        verdict = check_plan(raw, self.profile, self.guard if choice is None else without_floor(self.guard))
        self.transcript.write("guard", **verdict.to_dict(), notes=notes + policy)
        if not verdict.ok or verdict.plan is None:
            raise Rejected("guard", verdict.reasons, verdict.estimate, verdict.ratios)
        return verdict.plan, dict(verdict.estimate), dict(verdict.ratios), choice

    def request(self, messages: list[BaseMessage], constrained: bool, forced: bool, finder: ModeFinder) -> AIMessage:
        """Send one request; a constrained one uses the finder's mode, stepping past modes the server refuses."""
        while True:
            fmt = response_format(finder.mode, self.schema) if constrained else None
            if fmt is None:
                runnable = self.final if (forced or constrained) else self.bound
                return call_model(runnable.bind(**self.limit), messages, self.limits)
            self.transcript.write("request", structured=finder.mode)
            try:
                constrained_model = self.model.bind(response_format=fmt, **self.limit)
                return call_model(constrained_model, without_tool_turns(messages), self.limits)
            except PlannerFailure as failure:
                if failure.stage != "error" or not refuses_format(failure.status, failure.reason):
                    raise
                mode = finder.mode
                if not finder.give_up(f"refused by the server: {failure.reason}"):
                    raise
                self.transcript.write("structured", refused=mode, reason=failure.reason[:300], next=finder.mode)

    def resized(self, rej: Rejected) -> Resized | None:
        """Return the refused plan's groups sized to the goal for the repair turn (None: nothing new to offer)."""
        if self.resize is None or self.repair is None or rej.stage != "guard" or not rej.ratios:
            return None
        found = self.resize(rej.ratios)
        if found is not None:
            record = found.record
            self.transcript.write("resized", goal=record.goal, ratios=record.ratios, estimate=record.estimate)
        return found

    def repair_text(self, rej: Rejected, keep_tools: bool, resized: Resized | None = None) -> str:
        """Return the repair turn: the proposal inline when there is one, else the reasons alone.

        `resized` (the refused plan's groups at the goal's ratios) is shown before the proposal or alternatives.
        """
        shown = None
        if self.repair is not None:
            target = self.repair.target
            offered = self.offer.text(target)
            extra = resized.text(target) if resized is not None else ""
            shown = self.repair.message(rej.reasons, rej.estimate, keep_tools, rej.stage != "parse", offered, extra)
        if shown is not None:
            return shown
        reasons = "\n".join(f"- {r}" for r in rej.reasons)
        if rej.stage == "parse":
            return RETRY_PARSE.format(reasons=reasons)
        return RETRY_GUARD.format(reasons=reasons, tools=TOOLS_HELP if keep_tools else "")
