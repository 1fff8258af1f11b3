"""The checkpoints' serializer: LangGraph's JsonPlusSerializer, told which typed models of the state it may rebuild.

A checkpoint stores the pydantic models and enums of the run state as msgpack extension types named by module and
class. In its default mode LangGraph 1.2 rebuilds any such type but logs, on every read of a run's state (`resume`,
`runs`, `report`), that "deserializing unregistered type profiling_agent.state.ProfileSummary ... will be blocked in a
future version"; under `LANGGRAPH_STRICT_MSGPACK=true` it rebuilds only its safe types and the ones the compiled
graph registers from the state schema. Naming every model and enum of the state explicitly keeps them resuming in
either mode (and whatever the next default is), and the warning off.

A saved model is named by its class's module, and three layouts of the state have written checkpoints:

- `state.py`, one module (up to commit a274902): `profiling_agent.state.ProfileSummary`;
- a `state/` package of modules (from commit ad9928d): `profiling_agent.state.records.ProfileSummary`;
- today, `state.py` with the schemas in `schemas/`: `profiling_agent.schemas.records.ProfileSummary`.

Today's names and `profiling_agent.state.NAME` (the state module still exports every model) are registered. The
package's module names no longer import: `StateSerializer` renames them to today's modules (`RENAMED_MODULES`)
before LangGraph reads the type, so those checkpoints rebuild the same classes, in either mode.
"""

from __future__ import annotations

import enum
import inspect
from typing import Any

import ormsgpack
from langgraph.checkpoint.serde.jsonplus import (
    EXT_CONSTRUCTOR_KW_ARGS,
    EXT_CONSTRUCTOR_POS_ARGS,
    EXT_CONSTRUCTOR_SINGLE_ARG,
    EXT_METHOD_SINGLE_ARG,
    EXT_PYDANTIC_V1,
    EXT_PYDANTIC_V2,
    JsonPlusSerializer,
)
from pydantic import BaseModel

from profiling_agent import state

# the modules of the `state/` package (from commit ad9928d) -> the module each one's classes live in today
RENAMED_MODULES = {
    "profiling_agent.state.base": "profiling_agent.schemas.base",
    "profiling_agent.state.graph_state": "profiling_agent.state",
    "profiling_agent.state.inputs": "profiling_agent.schemas.inputs",
    "profiling_agent.state.migrations": "profiling_agent.schemas.migrations",
    "profiling_agent.state.plans": "profiling_agent.schemas.plans",
    "profiling_agent.state.records": "profiling_agent.schemas.records",
    "profiling_agent.state.settings": "profiling_agent.schemas.settings",
}
# the extension types LangGraph writes as (module, name, arguments, ...): the ones naming a class
_NAMED_TYPES = frozenset(
    {
        EXT_CONSTRUCTOR_SINGLE_ARG,
        EXT_CONSTRUCTOR_POS_ARGS,
        EXT_CONSTRUCTOR_KW_ARGS,
        EXT_METHOD_SINGLE_ARG,
        EXT_PYDANTIC_V1,
        EXT_PYDANTIC_V2,
    }
)
_OPTIONS = ormsgpack.OPT_NON_STR_KEYS
_OLD_PREFIX = b"profiling_agent.state."  # in every payload naming a module of the package, and in no other's


def state_types() -> list[tuple[str, str]]:
    """Return (module, class name) of every pydantic model and enum of the state, under both of its names.

    Each class is named by the module defining it (what new checkpoints store) and by `profiling_agent.state`
    (what checkpoints written while the state was one module store).
    """
    found = [
        obj
        for obj in vars(state).values()
        if inspect.isclass(obj)
        and issubclass(obj, (BaseModel, enum.Enum))
        and obj.__module__.startswith("profiling_agent.")
    ]
    return sorted({(obj.__module__, obj.__name__) for obj in found} | {(state.__name__, obj.__name__) for obj in found})


def _renamed_ext(code: int, data: bytes) -> ormsgpack.Ext:
    """Return one extension value (and those nested in it) with a package module's name replaced by today's."""
    value = ormsgpack.unpackb(data, ext_hook=_renamed_ext, option=_OPTIONS)
    if code in _NAMED_TYPES and isinstance(value, list) and value and value[0] in RENAMED_MODULES:
        value[0] = RENAMED_MODULES[value[0]]
    return ormsgpack.Ext(code, ormsgpack.packb(value, option=_OPTIONS))


def renamed_modules(payload: bytes) -> bytes:
    """Return a msgpack checkpoint payload with every type named by a module of the `state/` package renamed.

    A payload that names none of them is returned as it is.
    """
    if _OLD_PREFIX not in payload:
        return payload
    return ormsgpack.packb(ormsgpack.unpackb(payload, ext_hook=_renamed_ext, option=_OPTIONS), option=_OPTIONS)


class StateSerializer(JsonPlusSerializer):
    """LangGraph's serializer reading the module names of the `state/` package as today's modules."""

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        """Rebuild a stored value; a msgpack one is read with the package's module names renamed first."""
        kind, payload = data
        if kind == "msgpack":
            payload = renamed_modules(payload)
        return super().loads_typed((kind, payload))


def state_serializer() -> JsonPlusSerializer:
    """Return the serializer every checkpointer of a run uses (SQLite and PostgreSQL alike)."""
    return StateSerializer(allowed_msgpack_modules=state_types())
