"""The checkpoints' serializer: LangGraph's JsonPlusSerializer, told which typed models of `state/` it may rebuild.

A checkpoint stores the pydantic models and enums of the run state as msgpack extension types. In its default mode
LangGraph 1.2 rebuilds any such type but logs, on every read of a run's state (`resume`, `runs`, `report`), that
"deserializing unregistered type profiling_agent.state.ProfileSummary ... will be blocked in a future version";
under `LANGGRAPH_STRICT_MSGPACK=true` it rebuilds only its safe types and the ones the compiled graph registers from
the state schema. Naming every model and enum of the `state` package explicitly keeps them resuming in either mode
(and whatever the next default is), and the warning off.

A saved model is named by its class's module: `profiling_agent.state.ProfileSummary` in checkpoints written while the
state was one module (`state.py`), `profiling_agent.state.records.ProfileSummary` since the package split it by
meaning. Both names are registered: `profiling_agent.state` still exports every model, so an older checkpoint
rebuilds the same class.
"""

from __future__ import annotations

import enum
import inspect

from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from pydantic import BaseModel


def state_types() -> list[tuple[str, str]]:
    """Return (module, class name) of every pydantic model and enum of the `state` package, under both names.

    Each class is named by the module defining it (what new checkpoints store) and by `profiling_agent.state`
    (what checkpoints written before the split store).
    """
    from profiling_agent import state

    found = [
        obj
        for obj in vars(state).values()
        if inspect.isclass(obj)
        and issubclass(obj, (BaseModel, enum.Enum))
        and obj.__module__.startswith(f"{state.__name__}.")
    ]
    return sorted({(obj.__module__, obj.__name__) for obj in found} | {(state.__name__, obj.__name__) for obj in found})


def state_serializer() -> JsonPlusSerializer:
    """Return the serializer every checkpointer of a run uses (SQLite and PostgreSQL alike)."""
    return JsonPlusSerializer(allowed_msgpack_modules=state_types())
