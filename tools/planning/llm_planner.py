"""LLM planner: prompt, bounded tool-calling loop, guarded JSON plan, and the deterministic plan as fallback."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langgraph.errors import GraphBubbleUp

from profiling_agent.prompts.analysis import render_analysis
from profiling_agent.prompts.iterative import Feedback, render_iterative
from profiling_agent.state import (
    CompressionPlan,
    Context,
    Fallback,
    GroupSensitivity,
    LLMStep,
    Objective,
    PlannerProfile,
    PlanningProblem,
    RejectedAnswer,
    StructuredFacts,
)
from profiling_agent.tools.evaluation.selection import select_best
from profiling_agent.tools.planning import llm_conversation
from profiling_agent.tools.planning.alternatives import Offer, OfferInputs, offer_alternatives, without_floor
from profiling_agent.tools.planning.deterministic import PlanResult
from profiling_agent.tools.planning.llm_client import (
    Stage,
    Transcript,
    build_chat_model,
    empty_usage,
    message_text,
)
from profiling_agent.tools.planning.llm_conversation import AcceptedAnswer, ConversationState, initial_state
from profiling_agent.tools.planning.llm_repair import REPAIR_MARK, Repair
from profiling_agent.tools.planning.llm_session import Conversation
from profiling_agent.tools.planning.llm_tools import ModelInfo, make_planning_tools
from profiling_agent.tools.planning.plan_guard import GuardConfig
from profiling_agent.tools.planning.proposal import (
    Proposal,
    ProposalAnswer,
    ProposalDiff,
    Propose,
    compare_to_proposals,
    propose,
)
from profiling_agent.tools.planning.resize import ResizeInputs, resizer
from profiling_agent.tools.planning.round_inputs import RoundInputs
from profiling_agent.tools.planning.structured import AUTO_ORDER, ModeFinder, StructuredMode
from profiling_agent.tools.planning.token_plan import TokenOption, fallback_option
from profiling_agent.tools.planning.trials import Evaluate

logger = logging.getLogger(__name__)
__all__ = ["LLMOutcome", "llm_round", "plan_with_llm", "render_messages"]


@dataclass
class LLMOutcome:
    """The plan to apply and how it was obtained.

    Attributes:
        plan: The LLM's guarded plan, or the deterministic fallback's.
        planner: "llm" when the LLM's plan is applied, "deterministic" after a fallback.
        fallbacks: One Fallback per fallback (reason, stage, rejected, tool_errors, model; the round is set later).
        transcript: Transcript path relative to the run folder, or None when there is no run folder.
        estimate: The guard's predicted reduction of the LLM plan ({"params", "macs", "latency"}, from group
            cost shares); empty after a fallback.
        usage: Token usage summed over the step's replies ({"calls", "input_tokens", "output_tokens",
            "total_tokens"}), as reported by the server.
        tool_errors: Tool calls refused or failed this step ({"name", "error"}): unknown tools, bad arguments.
        structured: The schema-constrained mode used and found ({"choice", "mode", "confirmed", "given_up"}).
        vs_proposal: What the applied LLM plan changed relative to the closest propose_plan answer (None after a
            fallback).
    """

    plan: CompressionPlan
    planner: str
    fallbacks: list[Fallback] = field(default_factory=list)
    transcript: str | None = None
    estimate: dict[str, float] = field(default_factory=dict)
    usage: dict[str, int] = field(default_factory=lambda: empty_usage())
    tool_errors: list[dict[str, str]] = field(default_factory=list)
    structured: StructuredFacts = field(default_factory=StructuredFacts)
    vs_proposal: ProposalDiff | None = None
    sent_back: int = 0
    tools_dropped: str | None = None  # why this step stopped offering tools (decided here, for the rest of the run)

    def applied(self) -> str:
        """Say plainly whether the LLM's plan was applied, edited or copied from the proposal, or replaced, and why."""
        if self.planner != "llm":
            why = f"{self.fallbacks[-1].stage}: {self.fallbacks[-1].reason}" if self.fallbacks else "no LLM plan"
            return f"replaced: the deterministic plan was applied ({why})"
        after = f" after {self.sent_back} answer(s) sent back" if self.sent_back else ""
        diff = self.vs_proposal
        goal = f" at goal {diff.goal:.0%}" if diff is not None and diff.goal is not None else ""
        why = f" (why: {diff.why})" if diff is not None and diff.why else ""
        if diff is not None and diff.verdict == "chosen":
            return (
                f"chosen: alternative {diff.choice} ({diff.alternative}) unchanged, accepted by the guard{after}{why}"
            )
        if diff is not None and diff.verdict == "resized":
            return f"resized: the groups of its own refused plan at the ratios the repair offered{goal}{after}{why}"
        if diff is not None and diff.verdict == "edited":
            base = (
                f"alternative {diff.choice} ({diff.alternative})"
                if diff.choice
                else diff.alternative or "the deterministic proposal"
            )
            return f"edited: {base}{goal} with {diff.changes} change(s), accepted by the guard{after}{why}"
        if diff is not None and diff.verdict == "copied":
            return f"copied: the deterministic proposal{goal} unchanged, accepted by the guard{after}"
        return f"applied: the LLM's own plan, accepted by the guard{after}"

    def summary(self, model: str) -> LLMStep:
        """Return the facts about this step for the state history and result.json (never the API key)."""
        return LLMStep(
            model=model,
            planner=self.planner,
            transcript=self.transcript,
            usage=dict(self.usage),
            tool_errors=list(self.tool_errors),
            structured=self.structured,  # validated into a new dict
            vs_proposal=self.vs_proposal.label() if self.vs_proposal else None,
            applied=self.applied(),
            tools_dropped=self.tools_dropped,
        )


def known_structured_mode(inputs: RoundInputs) -> StructuredMode | None:
    """Return the structured-output mode an earlier round of this run confirmed with the server, if any."""
    for candidate in reversed(inputs.candidates):
        llm = candidate.planner_meta.llm if candidate.planner_meta else None
        found = llm.structured if llm is not None else {}
        if found.get("confirmed") and found.get("mode") in AUTO_ORDER:
            return found["mode"]
    return None


def llm_round(inputs: RoundInputs) -> int:
    """Return the round being planned: `inputs.iteration`, or one past the last finished candidate if larger."""
    done = max((c.iteration for c in inputs.candidates), default=0)
    return max(inputs.iteration, done + 1, 1)


# ---------------------------------------------------------------- entry points


def render_messages(
    inputs: RoundInputs,
    ctx: Context,
    profile: dict[str, Any],
    sensitivity: Mapping[str, GroupSensitivity],
    iteration: int,
    guard: GuardConfig,
) -> list[BaseMessage]:
    """Build the analysis prompt (round 1) or the iterative prompt (later rounds)."""
    info = {"model": inputs.model_ref, "family": inputs.family}
    bounds = dataclasses.asdict(guard)
    probed = {name: record.model_dump() for name, record in sensitivity.items()}  # the prompts read the JSON
    if iteration <= 1:
        return render_analysis(
            profile, probed, inputs.objective, model_info=info, bounds=bounds, tool_rounds=ctx.llm_tool_rounds
        )
    candidates = [c.model_dump() for c in inputs.candidates]
    baseline = inputs.baseline_eval.model_dump() if inputs.baseline_eval else None
    best = (
        select_best(list(inputs.candidates), inputs.baseline_eval, inputs.objective) if inputs.baseline_eval else None
    )
    feedback = Feedback(
        iteration=iteration,
        candidates=candidates,
        baseline_eval=baseline,
        fallbacks=[f.model_dump() for f in inputs.fallbacks],
        best=best.model_dump() if best else None,
    )
    return render_iterative(
        profile,
        probed,
        inputs.objective,
        feedback,
        model_info=info,
        bounds=bounds,
        tool_rounds=ctx.llm_tool_rounds,
    )


def plan_with_llm(
    inputs: RoundInputs,
    ctx: Context,
    profile: dict[str, Any],
    sensitivity: Mapping[str, GroupSensitivity],
    fallback: PlanResult,
    *,
    chat_model: Any = None,
    evaluate_fn: Evaluate | None = None,
    conversation: Any = None,
) -> LLMOutcome:
    """Ask the LLM for this round's plan; fall back to the deterministic plan on any failure, never raise.

    Args:
        inputs: The round's inputs (objective, earlier candidates, baseline evaluation, run folder).
        ctx: Run context (LLM endpoint, timeout, retries, tool rounds).
        profile: The full profile.json dict (groups, group_costs, protected, layers, totals).
        sensitivity: The probe's record per group name.
        fallback: The deterministic planner's result for this round.
        chat_model: A LangChain chat model to use instead of building ChatOpenAI from `ctx` (tests).
        evaluate_fn: Optional callable that applies a plan to a copy of the model and returns its trial; when
            given, the LLM gets the `evaluate_plan` tool.
        conversation: The compiled conversation subgraph to run (None: `llm_conversation.conversation`). Run
            inside a graph node, it checkpoints every model and tool call under that node's run.

    Returns:
        The plan to apply, the planner that produced it, fallback records and the transcript path.
    """
    iteration = llm_round(inputs)
    transcript = Transcript.open(inputs.run_path, iteration)
    goal = proposal_goal(fallback, inputs.objective)
    guard = dataclasses.replace(llm_guard(inputs.objective, iteration), tokens=inputs.token_axis)
    finder = ModeFinder(ctx.llm_structured, known_structured_mode(inputs))
    proposals: list[Proposal] = []
    try:
        model = chat_model if chat_model is not None else build_chat_model(ctx)
        info: ModelInfo = {"model": inputs.model_ref, "family": inputs.family}
        facts = PlannerProfile.of(profile)  # the prompts' JSON, read once for the guard and the tools
        merging = fallback_option(inputs.token_axis, fallback.plan.tokens)
        problem = PlanningProblem.of(
            profile.get("groups") or [], profile.get("group_costs") or {}, sensitivity, inputs.objective
        )
        propose_fn = _proposer(problem, fallback, proposals, merging)
        # the tools check and measure any plan: the first plan's floor applies to the final answer only
        tools = make_planning_tools(facts, sensitivity, info, evaluate_fn, without_floor(guard), propose_fn)
        repair = Repair(propose_fn, goal, inputs.objective.target)
        quant = list(fallback.plan.quantization) if inputs.objective.quantize != "none" else []
        made_of = (facts, problem, repair.goal, quant, merging, inputs.token_axis)
        offer = offer_alternatives(OfferInputs(*made_of, fallback.predicted_pp, evaluate_fn), guard)
        proposals.extend(a.record for a in offer.alternatives)
        resize = resizer(ResizeInputs(*made_of[:5], guard, evaluate_fn, proposals))
        conv = Conversation(
            model,
            tools,
            ctx,
            transcript,
            facts,
            inputs.objective.quantize,
            fallback.plan,
            guard,
            repair,
            finder.known,
            offer,
            dropped_tools(inputs),
            resize,
        )
        messages = with_offer(render_messages(inputs, ctx, profile, sensitivity, iteration, guard), offer, inputs)
        # inside a graph node the conversation checkpoints under the node's run (LangGraph passes its config on)
        graph = conversation if conversation is not None else llm_conversation.conversation
        final = graph.invoke(initial_state(conv, messages), context=conv)
    except GraphBubbleUp:
        raise
    except Exception as exc:  # noqa: BLE001 - the LLM path must never crash the run
        logger.debug("LLM planner failed", exc_info=True)
        transcript.start()
        failed = _Failed("error", f"{type(exc).__name__}: {str(exc)[:300]}", [], empty_usage(), [])
        return _fall_back(transcript, fallback, ctx, failed, finder)
    return _conclude(final, conv, transcript, fallback, ctx, (propose_fn, repair, proposals))


def with_offer(messages: list[BaseMessage], offer: Offer, inputs: RoundInputs) -> list[BaseMessage]:
    """Append the offered alternatives to the prompt's last human turn (unchanged when none are offered)."""
    text = offer.text(inputs.objective.target)
    if not text or not messages or not isinstance(messages[-1], HumanMessage):
        return messages
    return [*messages[:-1], HumanMessage(content=f"{message_text(messages[-1])}\n\n{text}")]


def dropped_tools(inputs: RoundInputs) -> str | None:
    """Return why an earlier round of this run stopped offering tools (the model cannot use them), or None."""
    for candidate in inputs.candidates:
        llm = candidate.planner_meta.llm if candidate.planner_meta else None
        if llm is not None and llm.tools_dropped:
            return llm.tools_dropped
    return None


def replay_proposals(messages: list[Any], propose_fn: Propose, repair: Repair, proposals: list[Proposal]) -> None:
    """Make `proposals` hold every proposal the conversation showed, after a resume too (they are recomputed).

    A resumed conversation's earlier propose_plan calls and repair turn ran in another process; the deterministic
    proposals are the same at the same goal and emphasis, so they are computed again, in order.
    """
    asked = [
        c.get("args") or {}
        for m in messages
        if isinstance(m, AIMessage)
        for c in m.tool_calls
        if c.get("name") == "propose_plan"
    ]
    shown = any(isinstance(m, HumanMessage) and REPAIR_MARK in message_text(m) for m in messages)
    offered = [p for p in proposals if p.label is not None]  # the alternatives: offered before the conversation
    if len(proposals) - len(offered) >= len(asked) + int(shown):
        return
    proposals[:] = offered
    for args in asked:
        try:
            goal = float(args.get("goal", ""))
            propose_fn(goal / 100 if 1 < goal <= 100 else goal, str(args.get("emphasis") or "balanced"))
        except Exception:  # noqa: BLE001 - the tool answered an error then: no proposal was shown
            logger.debug("propose_plan call not replayed", exc_info=True)
    if shown:
        repair.cached, repair.failed = None, False
        repair.proposal()


FIRST_PLAN_SHARE = 0.5  # a plan the LLM writes in round 1 must be predicted to reach half of the objective's reduction


def llm_guard(objective: Objective, iteration: int) -> GuardConfig:
    """Return the guard of an LLM plan: the objective's target, the format example refused, and in round 1 a floor.

    A plan the LLM writes in round 1 is sent back (with the numbers) when its predicted reduction is below
    FIRST_PLAN_SHARE of the target: the copied format example removed 17% against a 40% objective. An offered
    alternative, chosen or edited, is the planner's own measured plan: the floor does not apply to it (when the
    deterministic round's trials backed off below the floor, the floor refused every alternative).
    """
    return GuardConfig(
        target=objective.target,
        target_reduction=objective.target_reduction,
        refuse_example=True,
        min_share_of_target=FIRST_PLAN_SHARE if iteration <= 1 else 0.0,
    )


def proposal_goal(fallback: PlanResult, objective: Objective) -> float:
    """Return the goal of the proposal a repair turn shows: the deterministic planner's goal this round.

    Its plan at that goal is the fallback's on the 0.05 ratio grid; without a usable goal, the objective's.
    """
    goal = fallback.target_estimate
    return float(goal) if isinstance(goal, (int, float)) and 0 < goal < 1 else objective.target_reduction


def _proposer(
    problem: PlanningProblem,
    fallback: PlanResult,
    out: list[Proposal],
    merging: TokenOption | None = None,
) -> Propose:
    """Build propose_plan's function: the deterministic plan at a goal, recorded in `out` for the comparison.

    When the deterministic round merges tokens (`merging`), so does every proposal, at the same measured row.
    """

    def propose_fn(goal: float, emphasis: str) -> ProposalAnswer:
        quant = list(fallback.plan.quantization) if problem.objective.quantize != "none" else []
        plan, record = propose(problem, goal, emphasis, quant, merging)
        out.append(record)
        return ProposalAnswer(goal=record.goal, emphasis=emphasis, predicted_reduction=record.estimate, plan=plan)

    return propose_fn


@dataclass
class _Failed:
    stage: Stage
    reason: str
    rejected: list[RejectedAnswer]
    usage: dict[str, int]
    tool_errors: list[dict[str, str]]


def _fall_back(
    transcript: Transcript, fallback: PlanResult, ctx: Context, failed: _Failed, finder: ModeFinder
) -> LLMOutcome:
    record = Fallback(
        reason=failed.reason,
        stage=failed.stage,
        rejected=failed.rejected,
        tool_errors=failed.tool_errors,
        model=ctx.llm_model,
    )
    logger.warning("LLM planner fell back to the deterministic plan (%s): %s", failed.stage, failed.reason)
    transcript.write("applied", text=f"replaced: the deterministic plan was applied ({failed.stage}: {failed.reason})")
    transcript.write("usage", **failed.usage)
    transcript.write("structured", **finder.record())
    transcript.write("fallback", **record.model_dump(exclude={"iteration"}))
    transcript.write("final", planner="deterministic", plan=fallback.plan.model_dump())
    return LLMOutcome(
        fallback.plan,
        "deterministic",
        [record],
        transcript.rel,
        {},
        failed.usage,
        failed.tool_errors,
        finder.record(),
    )


def chosen_diff(accepted: AcceptedAnswer, plan: CompressionPlan, proposals: list[Proposal]) -> ProposalDiff:
    """Compare the applied plan with the alternative the answer chose by label, else with every proposal it saw.

    An answer without a choice is compared with the propose_plan answers and the repair's proposals, and with the
    offered alternatives: the closest one names it (an offered alternative written out unchanged is its choice, one
    with a few changes an edit of it), so a plan is "own" only when it is far from everything the model was shown.
    """
    choice = accepted.get("choice") or {}
    offered = [p for p in proposals if p.label is not None]
    chosen = [p for p in offered if choice.get("label") and p.label == choice["label"]]
    if chosen:  # compared with the chosen one only; how many proposals the step showed is still recorded
        diff = compare_to_proposals(accepted["ratios"], plan, chosen)
        diff = diff.model_copy(update={"proposals": len(proposals)})
    else:
        asked = [p for p in proposals if p.label is None]
        diff = compare_to_proposals(accepted["ratios"], plan, asked)
        same = compare_to_proposals(accepted["ratios"], plan, offered) if offered else None
        if same is not None and (not asked or same.changes < diff.changes or same.changes == 0):
            diff = same.model_copy(update={"proposals": diff.proposals})
    return diff.model_copy(update={"why": str(choice.get("why") or ""), "offered": len(offered)})


def _conclude(
    final: ConversationState,
    conv: Conversation,
    transcript: Transcript,
    fallback: PlanResult,
    ctx: Context,
    shown: tuple[Callable[..., Any], Repair, list[Proposal]],
) -> LLMOutcome:
    """Turn the conversation's final state into the round's outcome: the accepted plan, or the fallback.

    `shown` is what rebuilds the proposals the model was shown (the proposer, the repair, the list they fill).
    """
    propose_fn, repair, proposals = shown
    finder = conv.finder(final.get("structured"))
    usage, tool_errors = dict(final.get("usage") or empty_usage()), list(final.get("tool_errors") or [])
    accepted = final.get("accepted")
    if not accepted:
        failure = final.get("failure") or {"stage": "error", "reason": "the conversation ended at its request bound"}
        stage = cast(Stage, failure["stage"])  # one of the stages: the conversation writes no other
        failed = _Failed(stage, failure["reason"], list(final.get("rejected") or []), usage, tool_errors)
        fell = _fall_back(transcript, fallback, ctx, failed, finder)
        fell.tools_dropped = final.get("tools_dropped")
        return fell
    plan = CompressionPlan.model_validate(accepted["plan"])
    replay_proposals(final["messages"], propose_fn, repair, proposals)
    proposals.extend(Proposal.model_validate(p) for p in final.get("resized") or [])
    diff = chosen_diff(accepted, plan, proposals)
    outcome = LLMOutcome(
        plan, "llm", [], transcript.rel, accepted["estimate"], usage, tool_errors, finder.record(), diff
    )
    outcome.sent_back, outcome.tools_dropped = accepted["sent_back"], final.get("tools_dropped")
    transcript.write("applied", text=outcome.applied())
    transcript.write("usage", **usage)
    transcript.write("structured", **finder.record())
    transcript.write("vs_proposal", label=diff.label(), **diff.model_dump())
    transcript.write("final", planner="llm", plan=plan.model_dump())
    return outcome
