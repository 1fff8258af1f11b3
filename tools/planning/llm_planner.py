"""LLM planner: prompt, bounded tool-calling loop, guarded JSON plan, and the deterministic plan as fallback."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from profiling_agent.state import CompressionPlan, Context, QuantEntry, State
from profiling_agent.tools.planning.deterministic import PlanResult
from profiling_agent.tools.planning.llm_client import (
    PlannerFailure,
    Stage,
    Transcript,
    _record_reply,
    add_usage,
    build_chat_model,
    call_model,
    empty_usage,
    message_text,
    request_deadline,
)
from profiling_agent.tools.planning.llm_tools import make_planning_tools
from profiling_agent.tools.planning.plan_guard import GuardConfig, check_plan
from profiling_agent.tools.planning.plan_parse import parse_plan_text

logger = logging.getLogger(__name__)

RETRY_GUARD = (
    "Your plan was rejected:\n{reasons}\nFix every problem (call the tools if that helps) and answer with the "
    "corrected JSON plan only."
)
RETRY_PARSE = (
    "Your answer could not be used: {reasons}\nAnswer with exactly one JSON object in the required plan format: no "
    "code, no comments."
)
FORCE_FINAL = "The tool budget is used up. Answer now with the final JSON plan only, without calling tools."
TOOL_BUDGET_SPENT = "error: tool budget exhausted; no more tool calls this step"
MAX_ANSWER_KEPT = 600  # characters of a rejected answer kept in the fallback record
STEP_BUDGET_REQUESTS = 4  # a planning step may take at most this many request deadlines in all


@dataclass
class LLMOutcome:
    """The plan to apply and how it was obtained.

    Attributes:
        plan: The LLM's guarded plan, or the deterministic fallback's.
        planner: "llm" when the LLM's plan is applied, "deterministic" after a fallback.
        fallbacks: One record per fallback: {"reason", "stage", "rejected", "tool_errors", "model"}.
        transcript: Transcript path relative to the run folder, or None when there is no run folder.
        estimate: The guard's predicted reduction of the LLM plan ({"params", "macs", "latency"}, from group
            cost shares); empty after a fallback.
        usage: Token usage summed over the step's replies ({"calls", "input_tokens", "output_tokens",
            "total_tokens"}), as reported by the server.
        tool_errors: Tool calls refused or failed this step ({"name", "error"}): unknown tools, bad arguments.
    """

    plan: CompressionPlan
    planner: str
    fallbacks: list[dict[str, Any]] = field(default_factory=list)
    transcript: str | None = None
    estimate: dict[str, float] = field(default_factory=dict)
    usage: dict[str, int] = field(default_factory=lambda: empty_usage())
    tool_errors: list[dict[str, str]] = field(default_factory=list)

    def summary(self, model: str) -> dict[str, Any]:
        """Return the JSON facts about this step for the state history and result.json (never the API key)."""
        return {
            "model": model,
            "planner": self.planner,
            "transcript": self.transcript,
            "usage": dict(self.usage),
            "tool_errors": list(self.tool_errors),
        }


class _Rejected(Exception):
    def __init__(self, stage: Stage, reasons: list[str]):
        super().__init__("; ".join(reasons))
        self.stage, self.reasons = stage, reasons


# ---------------------------------------------------------------- the plan policy


def apply_quantize_choice(
    plan: dict[str, Any], quantize: str, fallback_plan: CompressionPlan
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


def planning_round(state: State) -> int:
    """Return the round being planned: `state.iteration`, or one past the last finished candidate if larger."""
    done = max((c.iteration for c in state.candidates), default=0)
    return max(state.iteration, done + 1, 1)


@dataclass
class _Session:
    """One planning step: the tool loop, parsing, the guard and retries."""

    model: Any
    tools: list[Any]
    ctx: Context
    transcript: Transcript
    profile: dict[str, Any]
    quantize: str
    fallback_plan: CompressionPlan
    guard: GuardConfig = field(default_factory=GuardConfig)
    usage: dict[str, int] = field(default_factory=empty_usage)
    tool_errors: list[dict[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.by_name = {t.name: t for t in self.tools}
        self.deadline = request_deadline(self.ctx)
        self.bound, self.final = self._bind()

    def _bind(self) -> tuple[Any, Any]:
        try:
            bound = self.model.bind_tools(self.tools)
        except NotImplementedError:
            self.transcript.write("note", message="the model does not support tools; planning without them")
            return self.model, self.model
        try:
            final = self.model.bind_tools(self.tools, tool_choice="none")
        except (NotImplementedError, TypeError, ValueError):
            final = bound
        return bound, final

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
        if not verdict.ok:
            raise _Rejected("guard", verdict.reasons)
        return verdict.plan, verdict.estimate

    def run(self, messages: list[BaseMessage]) -> tuple[CompressionPlan, dict[str, float]]:
        """Talk to the model until it gives a plan the guard accepts (returned with its estimate), or raise."""
        rounds, forced, rejected = 0, False, []
        budget = STEP_BUDGET_REQUESTS * self.deadline
        stop_at = time.monotonic() + budget
        while True:
            left = stop_at - time.monotonic()
            if left <= 0:  # a server that answers every request just in time must not stall the run forever
                raise PlannerFailure("timeout", f"the planning step took longer than {budget:.1f} s", rejected)
            try:
                reply = call_model(self.final if forced else self.bound, messages, min(self.deadline, left))
            except PlannerFailure as failure:
                if failure.stage == "timeout" and left < self.deadline:
                    raise PlannerFailure(
                        "timeout", f"the planning step took longer than {budget:.1f} s", rejected
                    ) from None
                raise PlannerFailure(failure.stage, failure.reason, rejected) from None
            add_usage(self.usage, reply)
            _record_reply(self.transcript, reply)
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
                    forced = True
                    continue
                messages += self._run_tools(reply)
                rounds += 1
                continue
            text = message_text(reply)
            try:
                return self._accept(text)
            except _Rejected as rej:
                rejected.append({"stage": rej.stage, "reasons": rej.reasons, "answer": text[:MAX_ANSWER_KEPT]})
                if len(rejected) > self.ctx.llm_retries:
                    raise PlannerFailure(
                        rej.stage, f"{len(rejected)} invalid answers; last: {rej.reasons[0]}", rejected
                    ) from None
                template = RETRY_PARSE if rej.stage == "parse" else RETRY_GUARD
                retry = template.format(reasons="\n".join(f"- {r}" for r in rej.reasons))
                messages.append(HumanMessage(content=retry))
                self.transcript.write("prompt", role="human", content=retry)


# ---------------------------------------------------------------- entry points


def render_messages(
    state: State, ctx: Context, profile: dict[str, Any], sensitivity: dict[str, Any], iteration: int, guard: GuardConfig
) -> list[BaseMessage]:
    """Build the analysis prompt (round 1) or the iterative prompt (later rounds)."""
    from profiling_agent.prompts.analysis import render_analysis
    from profiling_agent.prompts.iterative import render_iterative

    info = {"model": state.model.ref, "family": state.family}
    if iteration <= 1:
        return render_analysis(
            profile, sensitivity, state.objective, model_info=info, guard=guard, tool_rounds=ctx.llm_tool_rounds
        )
    return render_iterative(
        profile,
        sensitivity,
        state.objective,
        iteration=iteration,
        candidates=[c.model_dump() for c in state.candidates],
        baseline_eval=state.baseline_eval.model_dump() if state.baseline_eval else None,
        fallbacks=[f.model_dump() for f in state.fallbacks],
        model_info=info,
        guard=guard,
        tool_rounds=ctx.llm_tool_rounds,
    )


def plan_with_llm(
    state: State,
    ctx: Context,
    profile: dict[str, Any],
    sensitivity: dict[str, Any],
    fallback: PlanResult,
    *,
    chat_model: Any = None,
    evaluate_fn: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> LLMOutcome:
    """Ask the LLM for this round's plan; fall back to the deterministic plan on any failure, never raise.

    Args:
        state: The run state (objective, earlier candidates, baseline evaluation, run folder).
        ctx: Run context (LLM endpoint, timeout, retries, tool rounds).
        profile: The full profile.json dict (groups, group_costs, protected, layers, totals).
        sensitivity: Probe results per group name.
        fallback: The deterministic planner's result for this round.
        chat_model: A LangChain chat model to use instead of building ChatOpenAI from `ctx` (tests).
        evaluate_fn: Optional callable that applies a plan dict to a copy of the model and returns measured
            metrics; when given, the LLM gets the `evaluate_plan` tool.

    Returns:
        The plan to apply, the planner that produced it, fallback records and the transcript path.
    """
    iteration = planning_round(state)
    transcript = Transcript.open(state.run_path, iteration)
    guard = GuardConfig(target=state.objective.target, target_reduction=state.objective.target_reduction)
    usage, tool_errors = empty_usage(), []
    try:
        model = chat_model if chat_model is not None else build_chat_model(ctx)
        info = {"model": state.model.ref, "family": state.family}
        tools = make_planning_tools(profile, sensitivity, info, evaluate_fn, guard)
        messages = render_messages(state, ctx, profile, sensitivity, iteration, guard)
        for message in messages:
            transcript.write("prompt", role=message.type, content=message_text(message))
        session = _Session(
            model, tools, ctx, transcript, profile, state.objective.quantize, fallback.plan, guard, usage, tool_errors
        )
        plan, estimate = session.run(messages)
    except PlannerFailure as failure:
        failed = _Failed(failure.stage, failure.reason, failure.rejected, usage, tool_errors)
        return _fall_back(transcript, fallback, ctx, failed)
    except Exception as exc:  # noqa: BLE001 - the LLM path must never crash the run
        logger.debug("LLM planner failed", exc_info=True)
        failed = _Failed("error", f"{type(exc).__name__}: {str(exc)[:300]}", [], usage, tool_errors)
        return _fall_back(transcript, fallback, ctx, failed)
    transcript.write("usage", **usage)
    transcript.write("final", planner="llm", plan=plan.model_dump())
    return LLMOutcome(plan, "llm", [], transcript.rel, estimate, usage, tool_errors)


@dataclass
class _Failed:
    stage: Stage
    reason: str
    rejected: list[dict[str, Any]]
    usage: dict[str, int]
    tool_errors: list[dict[str, str]]


def _fall_back(transcript: Transcript, fallback: PlanResult, ctx: Context, failed: _Failed) -> LLMOutcome:
    record = {
        "reason": failed.reason,
        "stage": failed.stage,
        "rejected": failed.rejected,
        "tool_errors": failed.tool_errors,
        "model": ctx.llm_model,
    }
    logger.warning("LLM planner fell back to the deterministic plan (%s): %s", failed.stage, failed.reason)
    transcript.write("usage", **failed.usage)
    transcript.write("fallback", **record)
    transcript.write("final", planner="deterministic", plan=fallback.plan.model_dump())
    return LLMOutcome(fallback.plan, "deterministic", [record], transcript.rel, {}, failed.usage, failed.tool_errors)
