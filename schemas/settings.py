"""The choices a run accepts, each a `Literal` defined once (the run context `state.Context` is checked on them)."""

from __future__ import annotations

from typing import Any, Literal, get_args

EMBEDDED_MODEL = "embedded:vit-digits"
EMBEDDED_DATASET = "embedded:digits"

PruneType = Literal["structured", "head", "block"]
QuantDtype = Literal["qint8", "float16"]
QuantizeChoice = Literal["qint8", "float16", "none"]
PlannerChoice = Literal["deterministic", "llm", "auto", "l1", "l2", "random"]
BaselinePlanner = Literal["l1", "l2", "random"]
BASELINE_PLANNERS: tuple[BaselinePlanner, ...] = ("l1", "l2", "random")  # uniform baselines (compression/baselines.py)
SelectRule = Literal["paper", "budget"]
TargetMetric = Literal["params", "macs", "latency", "size"]
# the run context's choices (the CLI's `choices=` are derived from these with typing.get_args)
DeviceChoice = Literal["cpu", "cuda", "auto"]
BackendChoice = Literal["torch", "onnxruntime", "openvino", "auto"]
ImportanceChoice = Literal["l2", "l1", "random"]
RecoverChoice = Literal["none", "reconstruct", "distill", "auto"]
StructuredChoice = Literal["auto", "json_schema", "json_object", "off"]
# what a request uses (auto resolved): "json_object" carries the plan's schema (llama-cpp-python's grammar-constrained
# mode); "json" is the plain json_object without one, tried only after the schema-carrying modes were refused
StructuredMode = Literal["json_schema", "json_object", "json", "off"]


def choices(kind: Any) -> list[str]:
    """Return the values of a `Literal` choice, in order (what a CLI flag's `choices=` lists)."""
    return list(get_args(kind))


# the run context's settings restricted to a `Literal` choice, checked when a `Context` is built
CONTEXT_CHOICES: dict[str, Any] = {
    "device": DeviceChoice,
    "llm_structured": StructuredChoice,
    "importance": ImportanceChoice,
    "recover": RecoverChoice,
    "backend": BackendChoice,
}
