"""The choices a run accepts, each a `Literal` defined once, and the run context (`Context`: how to run)."""

from __future__ import annotations

from dataclasses import dataclass, field
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


def _ctx(default: Any, description: str) -> Any:
    return field(default=default, metadata={"description": description})


@dataclass
class Context:
    """Run-scoped settings: how to run, never what to optimize (a resume cannot change the goal)."""

    run_root: str = _ctx("runs", "Folder holding one sub-folder per thread (RUN_DIR).")
    device: DeviceChoice = _ctx("auto", "cpu, cuda or auto.")
    threads: int = _ctx(0, "Threads for profiling (0: torch's default) and for measuring forms (0: one, fair).")
    llm_model: str = _ctx("gpt-4o", "Chat model name on the OpenAI-compatible endpoint.")
    llm_base_url: str = _ctx("", "OpenAI-compatible base URL (default: $OPENAI_BASE_URL).")
    llm_api_key_env: str = _ctx("OPENAI_API_KEY", "Environment variable holding the API key (never stored).")
    llm_temperature: float = _ctx(0.0, "Sampling temperature of the LLM planner.")
    llm_timeout: float = _ctx(60.0, "Seconds before one LLM request times out.")
    llm_retries: int = _ctx(2, "Times an invalid LLM plan goes back to the LLM before the fallback.")
    llm_tool_rounds: int = _ctx(6, "Tool-call rounds allowed per planning step.")
    llm_max_tokens: int = _ctx(2048, "Most tokens one LLM reply may have (a rambling small model stops there).")
    llm_structured: StructuredChoice = _ctx(
        "auto", "Schema-constrained final answers (json_schema, json_object + schema, off); auto asks the server."
    )
    latency_warmup: int = _ctx(3, "Warm-up forward passes before timing.")
    latency_repeats: int = _ctx(15, "Timed repeats; the median is reported.")
    latency_batch: int = _ctx(16, "Batch size of the larger-batch latency.")
    eval_batch: int = _ctx(64, "Batch size for accuracy evaluation.")
    probe_ratio: float = _ctx(0.3, "Ratio each group is pruned at by the sensitivity probe.")
    importance: ImportanceChoice = _ctx("l2", "Channel/head importance: l2, l1 or random.")
    recover: RecoverChoice = _ctx(
        "auto", "Recovery after pruning: none, reconstruct, distill or auto (both when it can)."
    )
    recover_steps: int = _ctx(0, "Distillation steps (0: scaled to the training images and the model size).")
    recover_minutes: float = _ctx(
        2.0,
        "Cap of one candidate's distillation, minutes (0: none): wall-clock with --recover-steps; automatic "
        "recovery counts CPU time per torch thread, so waiting for a shared core does not cut it.",
    )
    recover_lr: float = _ctx(0.0, "Peak AdamW learning rate of distillation (0: 3e-4, 1e-3 after removing blocks).")
    recover_batch: int = _ctx(0, "Images per distillation step (0: 32, 64 after removing blocks).")
    recover_augment: bool = _ctx(True, "Augment training images (random resized crop; flips for RGB images).")
    recover_procs: int = _ctx(1, "Processes distillation runs on (>1: a torch.distributed job; docs/distributed.md).")
    launcher: str = _ctx("torchrun --standalone --nproc-per-node {procs}", "Command starting that job ({procs}).")
    backend: BackendChoice = _ctx(
        "auto", "torch, onnxruntime, openvino or auto (every form): the fastest within budget ships."
    )

    def __post_init__(self) -> None:
        """Refuse a choice setting outside its `Literal` (a typo would otherwise run with a silent default)."""
        for name, kind in CONTEXT_CHOICES.items():
            if getattr(self, name) not in get_args(kind):
                raise ValueError(
                    f"Context.{name} must be one of {', '.join(get_args(kind))}, not {getattr(self, name)!r}"
                )

    @classmethod
    def of(cls, values: dict[str, Any]) -> Context:
        """Build from a dict; keys that are not settings (another version's) are ignored."""
        return cls(**{k: v for k, v in values.items() if k in cls.__dataclass_fields__})


# the Context settings restricted to a `Literal` choice, checked when a Context is built
CONTEXT_CHOICES: dict[str, Any] = {
    "device": DeviceChoice,
    "llm_structured": StructuredChoice,
    "importance": ImportanceChoice,
    "recover": RecoverChoice,
    "backend": BackendChoice,
}
