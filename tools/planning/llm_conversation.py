"""The LLM planner's conversation as a LangGraph subgraph: a model node, a tool node and a guard node."""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal, cast

from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, HumanMessage, ToolMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.runtime import Runtime
from langgraph.types import RetryPolicy
from typing_extensions import TypedDict

from profiling_agent.state import RejectedAnswer, StructuredFacts, StructuredMode
from profiling_agent.tools import interrupt
from profiling_agent.tools.planning.llm_client import PlannerFailure, add_usage, message_text, record_reply
from profiling_agent.tools.planning.llm_repair import answer_key, repeated_reason
from profiling_agent.tools.planning.llm_session import (
    CUT_OFF,
    FORCE_FINAL,
    MAX_ANSWER_KEPT,
    RETRY_PARSE,
    TOOL_BUDGET_SPENT,
    Conversation,
    Rejected,
    shortened,
)
from profiling_agent.tools.planning.structured import ModeFinder

TRANSIENT_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})
# one more attempt of a request that timed out or met a transient server error (the openai client's own retry is off)
REQUEST_RETRY = RetryPolicy(max_attempts=2, initial_interval=1.0, max_interval=5.0, retry_on=lambda exc: transient(exc))


class AcceptedAnswer(TypedDict):
    """The answer the guard accepted, as the conversation's state holds it (JSON: the state is checkpointed)."""

    plan: dict[str, Any]  # the guarded CompressionPlan, dumped
    estimate: dict[str, float]  # its predicted reduction per metric
    ratios: dict[str, float]  # its ratio per group
    sent_back: int  # answers refused before it
    choice: dict[str, str] | None  # the offered alternative it chose ({"label", "why"}), or None


class ConversationState(TypedDict, total=False):
    """The conversation of one planning step, checkpointed under the run's thread after every model or tool call."""

    messages: Annotated[list[AnyMessage], add_messages]  # the prompt, the model's replies, tool results, repairs
    budget: dict[str, int]  # {"tool_rounds", "retries", "requests"}: the bounds the routing functions enforce
    requests: int  # requests sent so far (a reply cut off at the token limit counts)
    rounds: int  # tool rounds run so far
    forced: bool  # the tool budget is spent: the next answer must be the final plan
    constrained: bool  # the next request is schema-constrained (no tools offered)
    mode: StructuredMode  # the structured mode of the last reply ("off": unconstrained)
    structured: StructuredFacts  # the structured-mode finder's record ({"choice", "mode", "confirmed", "given_up"})
    rejected: list[RejectedAnswer]  # answers refused so far
    refused: dict[str, str]  # answer key -> the first reason it was refused for
    usage: dict[str, int]  # token usage summed over the replies
    tool_errors: list[dict[str, str]]  # tool calls refused or failed ({"name", "error"})
    accepted: AcceptedAnswer | None  # the plan the guard accepted
    failure: dict[str, str] | None  # why the conversation ended without a plan: {"stage", "reason"}
    retried: bool  # a timed-out first request was sent again without tools (its one retry)
    tools_dropped: str | None  # why the first answer showed the model cannot use tools (then: constrained, no tools)
    resized: list[dict[str, Any]]  # the Proposal records of refused plans' groups sized to the goal, as shown


def transient(exc: BaseException) -> bool:
    """Return True for a failed request worth one more attempt: a timeout or a transient server error."""
    if not isinstance(exc, PlannerFailure):
        return False
    return exc.stage == "timeout" or exc.status in TRANSIENT_STATUS or "APIConnectionError" in exc.reason


TOOLS_DROPPED = (
    "the model cannot use tools ({why}): the rest of the run asks for schema-constrained answers without tools"
)


def first_with_tools(state: ConversationState, conv: Conversation) -> bool:
    """Return True while the conversation's first answer, to a request that offered tools, is being read."""
    return conv.has_tools and not state.get("constrained") and state.get("requests", 0) <= 1


def unusable(reason: str) -> str:
    """Say what an unusable first answer was: prose, or a plan the parser could not read (and why)."""
    if reason.startswith("no JSON object"):
        return "prose, neither a plan nor a tool call"
    return f"neither a tool call nor a plan the parser could read ({reason[:120]})"


def drop_tools(conv: Conversation, why: str) -> ConversationState:
    """Return the update that asks for constrained answers without tools from now on, written to the transcript."""
    conv.transcript.write("tools_dropped", reason=why)
    return {"constrained": True, "tools_dropped": why}


def initial_state(conv: Conversation, messages: list[BaseMessage]) -> ConversationState:
    """Return the conversation's input: the prompt and the bounds of the run's settings."""
    ctx = conv.ctx
    rounds = ctx.llm_tool_rounds if conv.has_tools else 0
    budget = {"tool_rounds": rounds, "retries": ctx.llm_retries, "requests": rounds + ctx.llm_retries + 2}
    return {"messages": cast("list[AnyMessage]", list(messages)), "budget": budget}


# ---------------------------------------------------------------- nodes


def start(state: ConversationState, runtime: Runtime[Conversation]) -> ConversationState:
    """Write the prompt to a new transcript and set the counters (a resume never runs this again)."""
    conv = runtime.context
    conv.transcript.start()
    for message in state["messages"]:
        conv.transcript.write("prompt", role=message.type, content=message_text(message))
    for note in conv.notes:
        conv.transcript.write("note", message=note)
    return {
        "requests": 0,
        "rounds": 0,
        "forced": False,
        "constrained": not conv.has_tools,  # without tools, every answer is the final one
        "structured": conv.finder(None).record(),
        "rejected": [],
        "refused": {},
        "usage": {"calls": 0, "input_tokens": 0, "output_tokens": 0, "total_tokens": 0},
        "tool_errors": [],
    }


def call_model(state: ConversationState, runtime: Runtime[Conversation]) -> ConversationState:
    """Send the conversation to the model (tools bound, or schema-constrained) and append its reply.

    A reply cut off at the token limit is refused as unparseable; a reply that calls tools past the tool budget
    gets "budget exhausted" tool results and a turn asking for the final plan. A transient failure (a timeout,
    a 429 or 5xx) raises `PlannerFailure` once, for the node's retry policy to send the request again; any other
    failure, or the retry's, ends the conversation with the deterministic plan as the fallback.
    """
    interrupt.check()  # a Ctrl-C between two requests stops here, with every answered call checkpointed
    conv = runtime.context
    finder = conv.finder(state.get("structured"))
    constrained, forced = bool(state.get("constrained")), bool(state.get("forced"))
    requests = state.get("requests", 0) + 1
    try:
        reply = conv.request(list(state["messages"]), constrained, forced, finder)
    except PlannerFailure as failure:
        if "LengthFinishReasonError" in failure.reason:
            cut: ConversationState = {**_cut_off(state, conv, finder), "requests": requests}
            if first_with_tools({**state, "requests": requests}, conv):
                cut |= drop_tools(conv, "the first answer ran to the token limit without a plan or a tool call")
            return cut
        if failure.stage == "timeout" and first_with_tools({**state, "requests": requests}, conv):
            dropped = drop_tools(conv, f"the first request timed out: {failure.reason[:120]}")
            return {**dropped, "requests": requests, "retried": True}  # sent again without tools: its one retry
        attempt = runtime.execution_info.node_attempt if runtime.execution_info else REQUEST_RETRY.max_attempts
        if transient(failure) and attempt < REQUEST_RETRY.max_attempts and not state.get("retried"):
            raise  # the node's retry policy sends it again
        return {"failure": {"stage": failure.stage, "reason": failure.reason}, "requests": requests}
    if reply.id is None or any(m.id == reply.id for m in state["messages"]):  # an id seen before would replace it
        reply = reply.model_copy(update={"id": str(uuid.uuid4())})
    usage = dict(state.get("usage") or {})
    add_usage(usage, reply)
    record_reply(conv.transcript, reply)
    update: ConversationState = {
        "messages": [reply],
        "requests": requests,
        "usage": usage,
        "structured": finder.record(),
        "mode": finder.mode if constrained else "off",
    }
    if reply.invalid_tool_calls and first_with_tools({**state, "requests": requests}, conv):
        update |= drop_tools(conv, "the first answer made a malformed tool call")
    if reply.tool_calls or reply.invalid_tool_calls:
        past = _past_tool_budget(state, conv, reply, forced)
        update |= past | {"messages": [reply, *past.get("messages", [])]}
    return update


def _cut_off(state: ConversationState, conv: Conversation, finder: ModeFinder) -> ConversationState:
    reason = CUT_OFF.format(tokens=conv.max_tokens)
    answer: RejectedAnswer = {"stage": "parse", "reasons": [reason], "answer": "", "structured": finder.mode}
    rejected = [*state.get("rejected", []), answer]
    conv.transcript.write("parse_error", reason=reason)
    update: ConversationState = {"rejected": rejected, "structured": finder.record()}
    if len(rejected) > state["budget"]["retries"]:
        update["failure"] = {"stage": "parse", "reason": f"{len(rejected)} invalid answers; last: {reason}"}
    else:
        update["messages"] = [HumanMessage(content=RETRY_PARSE.format(reasons=f"- {reason}"))]
    return update


def _past_tool_budget(
    state: ConversationState, conv: Conversation, reply: AIMessage, forced: bool
) -> ConversationState:
    rounds = state.get("rounds", 0)
    if forced:
        return {"failure": {"stage": "tool_loop", "reason": f"still calling tools after {rounds} tool rounds"}}
    if rounds < state["budget"]["tool_rounds"]:
        return {}
    calls = [*reply.tool_calls, *reply.invalid_tool_calls]
    spent = [
        ToolMessage(content=TOOL_BUDGET_SPENT, tool_call_id=c.get("id") or f"call_{n}", name=c.get("name") or "unknown")
        for n, c in enumerate(calls)
    ]
    conv.transcript.write("prompt", role="human", content=FORCE_FINAL)
    return {"messages": [*spent, HumanMessage(content=FORCE_FINAL)], "forced": True, "constrained": True}


def run_tools(state: ConversationState, runtime: Runtime[Conversation]) -> ConversationState:
    """Run the tool calls of the model's last reply; their results (or errors the model can read) go back to it."""
    reply = state["messages"][-1]
    assert isinstance(reply, AIMessage)
    messages, errors = runtime.context.run_tools(reply)
    return {
        "messages": cast("list[AnyMessage]", messages),
        "rounds": state.get("rounds", 0) + 1,
        "tool_errors": [*state.get("tool_errors", []), *errors],
    }


def check_answer(state: ConversationState, runtime: Runtime[Conversation]) -> ConversationState:
    """Accept the model's answer as the plan, or send it back with the repair (the proposal inline)."""
    conv = runtime.context
    reply = state["messages"][-1]
    text = message_text(reply)
    finder = conv.finder(state.get("structured"))
    try:
        plan, estimate, ratios, choice = conv.accept(text)
    except Rejected as rej:
        return _refuse(state, conv, finder, rej, reply)
    if state.get("mode", "off") != "off":
        finder.worked()
    sent_back = len(state.get("rejected", []))
    accepted: AcceptedAnswer = {
        "plan": plan.model_dump(),
        "estimate": estimate,
        "ratios": ratios,
        "sent_back": sent_back,
        "choice": choice,
    }
    return {"accepted": accepted, "structured": finder.record()}


def _refuse(
    state: ConversationState, conv: Conversation, finder: ModeFinder, rej: Rejected, reply: AnyMessage
) -> ConversationState:
    text, mode = message_text(reply), state.get("mode", "off")
    answer: RejectedAnswer = {
        "stage": rej.stage,
        "reasons": rej.reasons,
        "answer": text[:MAX_ANSWER_KEPT],
        "structured": mode,
    }
    rejected = [*state.get("rejected", []), answer]
    if rej.stage == "guard" and mode != "off":
        finder.worked()  # the answer parsed: the server honoured the schema
    if rej.stage == "parse" and mode != "off" and finder.give_up(f"ignored: {rej.reasons[0]}"):
        conv.transcript.write("structured", ignored=mode, next=finder.mode)
    update: ConversationState = {"rejected": rejected, "structured": finder.record()}
    # a plan the guard refused is the same plan under any mode; an unusable answer under another mode is the
    # server ignoring that mode, which the finder steps past
    key = answer_key(text) if rej.stage == "guard" else f"{mode} {answer_key(text)}"
    refused = dict(state.get("refused") or {})
    if key in refused:  # the same plan again: a third refusal would teach the model nothing
        conv.transcript.write("repeated", reason=refused[key])
        return update | {"failure": {"stage": rej.stage, "reason": repeated_reason(refused[key])}}
    refused[key] = rej.reasons[0]
    update["refused"] = refused
    if len(rejected) > state["budget"]["retries"]:
        return update | {
            "failure": {"stage": rej.stage, "reason": f"{len(rejected)} invalid answers; last: {rej.reasons[0]}"}
        }
    if rej.stage == "parse" and first_with_tools(state, conv):
        update |= drop_tools(conv, "the first answer was " + unusable(rej.reasons[0]))
    rounds, budget = state.get("rounds", 0), state["budget"]["tool_rounds"]
    dropped = state.get("tools_dropped") or update.get("tools_dropped")
    keep_tools = conv.has_tools and not state.get("forced") and not dropped and 0 < rounds < budget
    resized = conv.resized(rej)
    if resized is not None:  # kept in the state: a resumed run compares the applied plan with it too
        update["resized"] = [*state.get("resized", []), resized.record.model_dump()]
    retry = conv.repair_text(rej, keep_tools, resized)
    conv.transcript.write("prompt", role="human", content=retry)
    # a rambling refused answer must not fill the context: the same message id replaces it in the history
    update["messages"] = cast("list[AnyMessage]", [shortened(reply, text), HumanMessage(content=retry)])
    update["constrained"] = not keep_tools
    return update


def finish(state: ConversationState) -> ConversationState:
    """End the conversation: a plan accepted, a failure, or (the routing's bound) no plan within the requests."""
    if state.get("accepted") or state.get("failure"):
        return {}
    budget = state["budget"]
    reason = f"no plan the guard accepts within {budget['requests']} requests ({state.get('rounds', 0)} tool rounds)"
    return {"failure": {"stage": "tool_loop" if state.get("rounds") else "parse", "reason": reason}}


# ---------------------------------------------------------------- routing (pure, bounded whatever the model says)


def _requests_left(state: ConversationState) -> bool:
    return state.get("requests", 0) < state["budget"]["requests"]


def after_model(state: ConversationState) -> Literal["tools", "guard", "model", "finish"]:
    """Run the tools the reply called (within the tool budget), check a text answer, or ask again after a repair."""
    if state.get("failure"):
        return "finish"
    last = state["messages"][-1]
    if isinstance(last, AIMessage):
        if last.tool_calls or last.invalid_tool_calls:
            return "tools" if state.get("rounds", 0) < state["budget"]["tool_rounds"] else "finish"
        return "guard"
    return "model" if _requests_left(state) else "finish"


def after_tools(state: ConversationState) -> Literal["model", "finish"]:
    """Give the tool results back to the model while requests are left."""
    return "model" if _requests_left(state) else "finish"


def after_guard(state: ConversationState) -> Literal["model", "finish"]:
    """End on an accepted plan or a failure; send a refused answer back while retries and requests are left."""
    if state.get("accepted") or state.get("failure"):
        return "finish"
    if len(state.get("rejected", [])) > state["budget"]["retries"]:
        return "finish"
    return "model" if _requests_left(state) else "finish"


def build_conversation() -> Any:
    """Build the conversation subgraph, compiled without a checkpointer: it checkpoints under the caller's run."""
    builder = StateGraph(ConversationState, context_schema=Conversation)
    builder.add_node("start", start)
    builder.add_node("model", call_model, retry_policy=REQUEST_RETRY)
    builder.add_node("tools", run_tools)
    builder.add_node("guard", check_answer)
    builder.add_node("finish", finish)
    builder.add_edge(START, "start")
    builder.add_edge("start", "model")
    builder.add_conditional_edges("model", after_model)
    builder.add_conditional_edges("tools", after_tools)
    builder.add_conditional_edges("guard", after_guard)
    builder.add_edge("finish", END)
    return builder.compile(name="llm_conversation")


conversation = build_conversation()
