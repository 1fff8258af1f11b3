"""The LLM conversation subgraph: its nodes in the run's graph, a resume that repeats no answered call, its bounds."""

from __future__ import annotations

import json
from typing import Any

import pytest
from helpers.fake_llm import (
    ScriptedChatModel,
    ScriptedOpenAIServer,
    chat_completion,
    probe_records,
    vit_profile,
    vit_sensitivity,
)
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

from profiling_agent.graph.builder import build_graph
from profiling_agent.nodes.analyze import round_inputs
from profiling_agent.state import CompressionPlan, Context, Objective, PlanningProblem, State, Trial
from profiling_agent.tools.interrupt import Interrupted
from profiling_agent.tools.planning.deterministic import plan_round
from profiling_agent.tools.planning.llm_conversation import after_guard, after_model, after_tools
from profiling_agent.tools.planning.llm_planner import LLMOutcome, plan_with_llm

PROFILE = vit_profile(n_layers=2)
SENS = vit_sensitivity(PROFILE)
PLAN = {
    "pruning": [{"groups": ["layers.0.mlp", "layers.1.mlp"], "type": "structured", "ratio": 0.5, "justification": "x"}],
    "quantization": [{"layer": "all", "type": "dynamic", "dtype": "qint8", "justification": "Linear-heavy"}],
    "rationale": "prune both MLPs",
}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "OPENAI_MODEL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


def test_the_run_graph_shows_the_conversation_nodes_inside_analyze():
    nodes = set(build_graph().get_graph(xray=True).nodes)
    assert {"analyze:model", "analyze:tools", "analyze:guard"} <= nodes


class Outer(TypedDict, total=False):
    planner: str
    usage: dict[str, int]


def _planning_graph(tmp_path, ctx: Context, evaluate_fn: Any):
    """A one-node graph whose node runs the LLM planner, as the analyze node does, under a checkpointer."""
    state = State(run_path=str(tmp_path), family="vit", objective=Objective())
    fallback = plan_round(PlanningProblem.of(PROFILE["groups"], PROFILE["group_costs"], SENS, state.objective, []))

    def plan(_: Outer) -> dict[str, Any]:
        outcome: LLMOutcome = plan_with_llm(
            round_inputs(state, state.iteration), ctx, PROFILE, probe_records(SENS), fallback, evaluate_fn=evaluate_fn
        )
        return {"planner": outcome.planner, "usage": outcome.usage}

    builder = StateGraph(Outer)
    builder.add_node("plan", plan)
    builder.add_edge(START, "plan")
    builder.add_edge("plan", END)
    return builder.compile(checkpointer=InMemorySaver())


def test_a_resumed_conversation_sends_no_answered_model_call_again(tmp_path):
    evaluated: list[CompressionPlan] = []

    def evaluate_fn(plan: CompressionPlan) -> Trial:
        if any(e.ratio != 0.5 for e in plan.pruning):  # a trial of an offered alternative, not PLAN's
            return Trial(accuracy_drop_pp=1.0)
        evaluated.append(plan)
        if len(evaluated) == 1:  # Ctrl-C while the tool runs, after the model's first (tool-calling) answer
            raise Interrupted("interrupted")
        return Trial(accuracy_drop_pp=0.5, params_reduction=40.0)

    call = {"name": "evaluate_plan", "args": {"plan_json": json.dumps(PLAN)}, "id": "call_eval"}

    def answer(body: dict[str, Any]) -> dict[str, Any]:  # the plan once the tool result is in, else the tool call
        if body["messages"][-1]["role"] == "tool":
            return chat_completion(content=json.dumps(PLAN))
        return chat_completion(tool_calls=[call])

    script = [answer, answer, answer]
    with ScriptedOpenAIServer(script) as server:
        ctx = Context(
            llm_base_url=server.base_url,
            llm_timeout=5,
            llm_structured="off",
            llm_api_key_env="PA_CONVERSATION_UNSET",
        )
        graph = _planning_graph(tmp_path, ctx, evaluate_fn)
        config = {"configurable": {"thread_id": "t1"}}
        with pytest.raises(Interrupted):
            graph.invoke({}, config, durability="sync")
        assert len(server.requests) == 1  # the model answered once (a tool call), then the run stopped
        result = graph.invoke(None, config, durability="sync")  # resume
        assert len(server.requests) == 2  # the answered call was not sent again: only the next one
    assert result["planner"] == "llm" and result["usage"]["calls"] == 2  # the restored reply counts as answered
    assert len(evaluated) == 2  # the interrupted tool ran again, and once
    resumed = server.requests[1]["body"]["messages"]
    assert [m["role"] for m in resumed][-2:] == ["assistant", "tool"]  # the conversation continued where it was
    events = [
        json.loads(line)["event"]
        for line in (tmp_path / "iter_01/llm_transcript.jsonl").read_text().split("\n")
        if line
    ]
    assert events.count("reply") == 2 and events.count("prompt") == 2  # one transcript: nothing said twice


def test_every_refusal_ends_the_step_after_the_retries_whatever_the_model_says(tmp_path):
    answers = iter(range(1000))
    model = ScriptedChatModel(script=[lambda _: f"no plan, answer {next(answers)}"], repeat_last=True)
    state = State(run_path=str(tmp_path), family="vit", objective=Objective())
    fallback = plan_round(PlanningProblem.of(PROFILE["groups"], PROFILE["group_costs"], SENS, state.objective, []))
    ctx = Context(llm_timeout=1, llm_retries=3, llm_structured="off", llm_api_key_env="PA_CONVERSATION_UNSET")
    outcome = plan_with_llm(
        round_inputs(state, state.iteration), ctx, PROFILE, probe_records(SENS), fallback, chat_model=model
    )
    assert outcome.planner == "deterministic" and outcome.fallbacks[0].stage == "parse"
    assert len(model.calls) == 4 and "4 invalid answers" in outcome.fallbacks[0].reason


def _state(messages, **extra: Any) -> dict[str, Any]:
    return {"messages": messages, "budget": {"tool_rounds": 2, "retries": 2, "requests": 6}, **extra}


def test_the_routing_functions_bound_the_loop_by_tools_retries_and_requests():
    calls = AIMessage(content="", tool_calls=[{"name": "layer_profile", "args": {}, "id": "c1"}])
    answer, repair = AIMessage(content="{}"), HumanMessage(content="fix it")
    assert after_model(_state([calls], rounds=1, requests=2)) == "tools"
    assert after_model(_state([calls], rounds=2, requests=3)) == "finish"  # the tool budget, whatever the model says
    assert after_model(_state([answer], requests=1)) == "guard"
    assert after_model(_state([answer, repair], requests=5)) == "model"
    assert after_model(_state([answer, repair], requests=6)) == "finish"  # the request bound
    assert after_model(_state([answer], failure={"stage": "timeout", "reason": "x"})) == "finish"
    assert after_tools(_state([calls], requests=6)) == "finish"
    assert after_guard(_state([answer, repair], requests=2, rejected=[{}])) == "model"
    assert after_guard(_state([answer, repair], requests=2, rejected=[{}, {}, {}])) == "finish"  # the retries
    assert after_guard(_state([answer], accepted={"plan": {}})) == "finish"
