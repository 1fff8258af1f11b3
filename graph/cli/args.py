"""The CLI's argument parser and the translation of its flags into graph input and run context."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path
from typing import Any, NoReturn

from pydantic import ValidationError

from profiling_agent import __version__
from profiling_agent.state import (
    BackendChoice,
    DeviceChoice,
    InputState,
    PlannerChoice,
    QuantizeChoice,
    RecoverChoice,
    SelectRule,
    StructuredChoice,
    TargetMetric,
    choices,
)
from profiling_agent.tools import run_layout
from profiling_agent.tools.io import check_thread_id

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130
RUN_SETTINGS = run_layout.RUN_SETTINGS


class BadInput(Exception):
    """An error in what the user asked for: one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, no usage dump
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message}\n")


# ------------------------------------------------------------------------------------------- parser


def images(text: str) -> int | str:
    """Parse an image count: a whole number, or `all` (the whole split minus the test and calibration rows)."""
    return "all" if text.strip().lower() == "all" else int(text)


def subset_size(value: int | str | None, flag: str = "--subset") -> int | None:
    """Turn a parsed --subset into DatasetRef.subset (0: all); a count below 1 is bad input."""
    if value == "all":
        return 0
    if value is not None and int(value) < 1:
        raise BadInput(f"invalid {flag}: give a number of images (at least 8) or all")
    return None if value is None else int(value)


def _add_context_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run-dir", default="runs", help="folder holding one sub-folder per run (default: runs)")
    p.add_argument("--device", choices=choices(DeviceChoice), default=None, help="device (default: auto)")
    p.add_argument("--threads", type=int, default=None, help="torch threads for profiling and evaluation")
    p.add_argument("--no-plots", action="store_true", help="write report.md and report.html without charts")
    p.add_argument("--llm-model", default=None, help="chat model name (default: $OPENAI_MODEL, else gpt-4o)")
    p.add_argument("--llm-base-url", default=None, help="OpenAI-compatible base URL (default: $OPENAI_BASE_URL)")
    p.add_argument(
        "--llm-api-key-env", default=None, help="environment variable holding the API key (default: OPENAI_API_KEY)"
    )
    p.add_argument(
        "--llm-timeout",
        type=float,
        default=None,
        help="seconds one LLM request may take in all (default: no total limit; a stalled reply is cut by the two "
        "limits below)",
    )
    p.add_argument(
        "--llm-first-token-timeout",
        type=float,
        default=None,
        help="seconds an LLM request may wait for its first streamed token (default 900: a CPU server reading a "
        "long prompt)",
    )
    p.add_argument(
        "--llm-idle-timeout",
        type=float,
        default=None,
        help="seconds a streamed LLM reply may go without a new token before it is cut (default 60)",
    )
    p.add_argument("--llm-retries", type=int, default=None, help="invalid LLM plans sent back before the fallback")
    p.add_argument("--llm-tool-rounds", type=int, default=None, help="LLM tool-call rounds per planning step")
    p.add_argument("--llm-max-tokens", type=int, default=None, help="most tokens per LLM reply (default 2048)")
    p.add_argument(
        "--llm-structured",
        choices=choices(StructuredChoice),
        default=None,
        help="schema-constrained final answers: json_schema (OpenAI, vLLM, llama.cpp server), json_object with a "
        "schema (llama-cpp-python), off; auto (default) finds what the server accepts",
    )
    p.add_argument("--temperature", type=float, default=None, help="LLM sampling temperature")
    p.add_argument("--repeats", type=int, default=None, help="timed latency repeats (median reported)")
    p.add_argument(
        "--recover",
        choices=choices(RecoverChoice),
        default=None,
        help="accuracy recovery after pruning (default auto: reconstruct, then distill when training images exist)",
    )
    p.add_argument("--recover-steps", type=int, default=None, help="distillation steps (default: scaled to the data)")
    p.add_argument(
        "--recover-minutes", type=float, default=None, help="wall-clock cap per candidate, minutes (default 2; 0: none)"
    )
    p.add_argument(
        "--recover-lr",
        type=float,
        default=None,
        help="peak distillation learning rate (default 3e-4; 1e-3 after removing blocks)",
    )
    p.add_argument(
        "--recover-batch",
        type=int,
        default=None,
        help="images per distillation step (default 32; 64 after removing blocks)",
    )
    p.add_argument("--no-augment", action="store_true", help="train recovery on the images as they are")
    p.add_argument("--recover-procs", type=int, default=None, help="distillation processes (>1: torch.distributed)")
    p.add_argument(
        "--launcher",
        default=None,
        help="command template starting them (default: torchrun --standalone "
        "--nproc-per-node {procs}; see docs/distributed.md)",
    )
    p.add_argument(
        "--backend",
        choices=choices(BackendChoice),
        default=None,
        help="forms of each candidate to measure and deliver: torch, onnxruntime (ORT FP32, dynamic and static "
        "int8), openvino (FP32, bf16, NNCF INT8) or auto (all; default): the fastest within the budget is delivered",
    )


def _add_checkpoint_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--checkpoint-url",
        default=None,
        help="PostgreSQL URL (postgresql://USER:PASSWORD@HOST:PORT/DB) to keep checkpoints in "
        "(default: $PROFILING_AGENT_CHECKPOINT_URL, else RUN_DIR/checkpoints.sqlite)",
    )


def _refuse_goal_flags(run: argparse.ArgumentParser, resume: argparse.ArgumentParser) -> None:
    """Accept run's goal flags on resume only to refuse them clearly: a resume cannot change what is optimized."""
    taken = {opt for action in resume._actions for opt in action.option_strings}
    for action in run._actions:
        opts = [opt for opt in action.option_strings if opt not in taken]
        if opts and not isinstance(action, argparse._HelpAction):
            kind: dict[str, Any] = {"action": "store_true"} if action.nargs == 0 else {}
            hidden: dict[str, Any] = {"default": argparse.SUPPRESS, "help": argparse.SUPPRESS}
            resume.add_argument(*opts, dest=f"goal_{action.dest}", **hidden, **kind)


def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser of `profiling-agent`."""
    parser = _Parser(
        prog="profiling-agent",
        description="Profiling-guided pruning and quantization of HF image "
        "classifiers, driven by a LangGraph agent graph.",
    )

    parser.add_argument("--version", action="version", version=f"profiling-agent {__version__}")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser, metavar="COMMAND")

    run = _add_run(sub)
    _add_resume(sub, run)
    _add_inspection(sub)
    _add_evaluate(sub)
    _add_export_and_report(sub)
    return parser


def _add_run(sub: Any) -> argparse.ArgumentParser:
    """Add `run` (what to compress, on which data, toward which goal, and how) and return its parser."""
    run = sub.add_parser("run", help="compress a model (no arguments: the embedded offline default)")
    run.add_argument("--model", default=None, help="hub id, save_pretrained folder, artifact, or embedded:NAME")
    run.add_argument("--dataset", default=None, help="hub id, save_to_disk folder, imagefolder, or embedded:digits")
    run.add_argument("--split", default=None, help="dataset split (default: test)")
    run.add_argument(
        "--val-subset",
        "--subset",
        dest="subset",
        type=images,
        default=None,
        help="validation images the loop selects on (seeded subset, default 512; all: the whole split minus "
        "the test and calibration images)",
    )
    run.add_argument(
        "--test-subset",
        type=int,
        default=None,
        help="held-out test images, disjoint from validation and calibration, that report the result (default 512)",
    )
    run.add_argument("--test-split", default=None, help="split the test images come from (default: see README)")
    run.add_argument("--calibration", type=int, default=None, help="sensitivity-probe images (default 64)")
    run.add_argument("--train-split", default=None, help="split recovery trains on (default: train, when there is one)")
    run.add_argument(
        "--allow-weak-eval",
        action="store_true",
        help="run on data that cannot judge a model (one class, too few images), with a warning",
    )
    run.add_argument("--image-column", default=None)
    run.add_argument("--label-column", default=None)
    run.add_argument("--seed", type=int, default=None)
    run.add_argument("--iterations", type=int, default=None, help="pruning iterations (default 5)")
    run.add_argument(
        "--time-budget",
        type=float,
        default=None,
        metavar="MINUTES",
        help="wall-clock minutes the whole run may take: fewer trials, shorter recovery, fewer forms, then fewer "
        "rounds, and it says what it cut",
    )
    run.add_argument(
        "--beyond-target",
        type=int,
        default=None,
        help="rounds that may push past a met target while the best model left half the budget unused (default 1; "
        "0 stops at the target)",
    )
    run.add_argument(
        "--planner",
        choices=choices(PlannerChoice),
        default=None,
        help="l1/l2/random: uniform pruning baseline at --ratio (one iteration)",
    )
    run.add_argument("--ratio", type=float, default=None, help="pruning ratio of the l1/l2/random baselines, in (0, 1)")
    run.add_argument("--quantize", choices=choices(QuantizeChoice), default=None)
    run.add_argument("--select", choices=choices(SelectRule), default=None, help="best-candidate rule")
    run.add_argument("--max-acc-drop", type=float, default=None, help="accuracy budget in percentage points")
    run.add_argument("--target", choices=choices(TargetMetric), default=None)
    run.add_argument("--target-reduction", type=float, default=None, help="e.g. 0.4 = 40%% reduction of --target")
    run.add_argument("--trust-remote-code", action="store_true")
    run.add_argument(
        "--thread-id", default=None, help="run id and folder name: letters, digits, . _ - (default: generated)"
    )
    run.add_argument("--approve", action="store_true", help="pause before each plan is applied for your decision")
    run.add_argument(
        "--depth",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="let the planners remove whole blocks (ViT/DeiT layers, ResNet identity blocks) as well as channels and "
        "heads (default: only under --target latency)",
    )
    _add_context_flags(run)
    _add_checkpoint_flag(run)
    return run


def _add_resume(sub: Any, run: argparse.ArgumentParser) -> None:
    """Add `resume`: the "how" flags may change, the goal flags of `run` are refused."""
    resume = sub.add_parser("resume", help="continue an interrupted run from its last checkpoint")
    resume.add_argument("thread_id")
    resume.add_argument("--decision", choices=["approve", "edit", "reject"], default=None, help="answer a paused plan")
    resume.add_argument("--plan", default=None, help="with --decision edit: the plan to apply instead (JSON file)")
    _add_context_flags(resume)  # "how" settings may change on resume
    _add_checkpoint_flag(resume)
    _refuse_goal_flags(run, resume)


def _add_inspection(sub: Any) -> None:
    """Add `profile` (one model's per-layer table) and `runs` (the threads of a run folder)."""
    prof = sub.add_parser("profile", help="profile a model and print its per-layer table")
    prof.add_argument("--model", default=None)
    prof.add_argument("--top", type=int, default=30)
    prof.add_argument("--device", choices=choices(DeviceChoice), default="auto")
    prof.add_argument("--json", dest="json_out", default=None, help="also write the full profile here")

    runs = sub.add_parser("runs", help="list runs and their status")
    runs.add_argument("--run-dir", default="runs")
    _add_checkpoint_flag(runs)


def _add_evaluate(sub: Any) -> None:
    """Add `evaluate`: a model, a baseline or a saved compressed model on a dataset or a run's images."""
    ev = sub.add_parser("evaluate", help="evaluate a model, a baseline or a saved compressed model")
    ev.add_argument("--model", required=True)
    ev.add_argument("--dataset", default=None)
    ev.add_argument("--split", default="test")
    ev.add_argument(
        "--subset", type=images, default=512, help="seeded subset of --split (the run's validation draw), or all"
    )
    ev.add_argument(
        "--from-run",
        metavar="RUN_DIR/THREAD_ID",
        default=None,
        help="evaluate on exactly the images a run used for --part (its subsets.json); dataset and split from the run",
    )
    ev.add_argument("--part", choices=["validation", "test"], default="test", help="with --from-run: which images")
    ev.add_argument("--seed", type=int, default=0)
    ev.add_argument("--image-column", default=None)
    ev.add_argument("--label-column", default=None)
    ev.add_argument("--device", choices=choices(DeviceChoice), default="auto")
    ev.add_argument("--json", dest="json_out", default=None, help="write the metrics as JSON here")


def _add_export_and_report(sub: Any) -> None:
    """Add `export` (a finished run's best model to ONNX or OpenVINO) and `report` (rebuild its report)."""
    exp = sub.add_parser("export", help="export a finished run's best model to ONNX or OpenVINO (optionally int8)")
    exp.add_argument("run_path", metavar="RUN_DIR/THREAD_ID", help="the finished run's folder")
    exp.add_argument("--format", choices=["onnx", "openvino"], default="onnx", help="onnx or openvino (IR)")
    exp.add_argument(
        "--quantize",
        choices=["dynamic", "static", "int8", "none"],
        default="none",
        help="onnx: dynamic (Linear layers) or static (QDQ, calibrated); openvino: int8 (NNCF, calibrated)",
    )
    exp.add_argument("--out", default=None, help="destination folder (default: RUN/THREAD/export/FORMAT-QUANTIZE)")
    exp.add_argument("--threads", type=int, default=None, help="runtime threads for the check")

    rep = sub.add_parser("report", help="rebuild plots, report.md and report.html of a finished run")
    rep.add_argument("run_path", metavar="RUN_DIR/THREAD_ID", help="the finished run's folder")


# ------------------------------------------------------------------------------------------- helpers


def _set(target: dict[str, Any], key: str, value: Any) -> None:
    if value is not None:
        target[key] = value


def thread_id_arg(thread_id: str) -> str:
    """Return a --thread-id or resume's THREAD_ID when it is a safe folder name, else raise BadInput (exit 2)."""
    try:
        return check_thread_id(thread_id)
    except ValueError as exc:
        raise BadInput(str(exc)) from None


def input_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """Build the graph input (model, dataset, objective) from the run flags, validated by the schemas."""
    model: dict[str, Any] = {}
    _set(model, "ref", args.model)
    if args.trust_remote_code:
        model["trust_remote_code"] = True
    dataset: dict[str, Any] = {}
    for key in (
        "split",
        "test_subset",
        "test_split",
        "train_split",
        "calibration",
        "image_column",
        "label_column",
        "seed",
    ):
        _set(dataset, key, getattr(args, key))
    _set(dataset, "ref", args.dataset)
    _set(dataset, "subset", subset_size(args.subset))
    objective: dict[str, Any] = {}
    keys = ("iterations", "beyond_target", "planner", "ratio", "quantize", "select", "max_acc_drop", "target")
    for key in (*keys, "target_reduction", "time_budget"):
        _set(objective, key, getattr(args, key, None))
    _set(objective, "depth", getattr(args, "depth", None))
    if getattr(args, "allow_weak_eval", False):
        dataset["allow_weak_eval"] = True
    if getattr(args, "approve", False):
        objective["approve"] = True
    try:
        return InputState.model_validate({"model": model, "dataset": dataset, "objective": objective}).model_dump()
    except ValidationError as exc:
        err = exc.errors()[0]
        where = "--" + str(err["loc"][-1]).replace("_", "-")
        if tuple(err["loc"]) == ("objective",):  # Objective's cross-field check of --planner and --ratio
            where, err["msg"] = "--planner/--ratio", err["msg"].removeprefix("Value error, ")
        raise BadInput(f"invalid {where}: {err['msg']}") from None


def context_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """Build the run context from flags (only the flags given; defaults come from Context)."""
    ctx: dict[str, Any] = {"run_root": str(Path(args.run_dir).resolve())}
    _set(ctx, "device", args.device)
    _set(ctx, "threads", args.threads)
    _set(ctx, "llm_model", args.llm_model or os.environ.get("OPENAI_MODEL") or None)
    _set(ctx, "llm_base_url", args.llm_base_url)
    _set(ctx, "llm_api_key_env", args.llm_api_key_env)
    _set(ctx, "llm_timeout", args.llm_timeout)
    _set(ctx, "llm_first_token_timeout", args.llm_first_token_timeout)
    _set(ctx, "llm_idle_timeout", args.llm_idle_timeout)
    _set(ctx, "llm_retries", args.llm_retries)
    _set(ctx, "llm_tool_rounds", args.llm_tool_rounds)
    _set(ctx, "llm_structured", args.llm_structured)
    _set(ctx, "llm_max_tokens", args.llm_max_tokens)
    _set(ctx, "llm_temperature", args.temperature)
    _check_llm_flags(args)
    _set(ctx, "latency_repeats", args.repeats)
    _recover_flags(args, ctx)
    _set(ctx, "backend", args.backend)
    if getattr(args, "no_plots", False):
        ctx["plots"] = False
    if args.threads is not None and args.threads < 1:
        raise BadInput("invalid --threads: must be at least 1")
    if args.repeats is not None and args.repeats < 1:
        raise BadInput("invalid --repeats: must be at least 1")
    if args.device == "cuda":
        import torch  # lazy: torch; the CLI's flag check runs without it

        if not torch.cuda.is_available():
            raise BadInput("--device cuda was requested but no CUDA device is available")
    _check_gpu_procs(args, ctx)
    return ctx


def _check_gpu_procs(args: argparse.Namespace, ctx: dict[str, Any]) -> None:
    """Refuse more processes than GPUs on CUDA with the default (one-node) launcher: each process takes one GPU."""
    procs = int(ctx.get("recover_procs") or 1)
    if procs < 2 or ctx.get("launcher") or args.device == "cpu":
        return
    import torch  # lazy: torch; the CLI's flag check runs without it

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus and procs > gpus:
        raise BadInput(
            f"invalid --recover-procs {procs}: on CUDA each process takes one GPU and this machine has {gpus}; "
            f"use --recover-procs {gpus}, --device cpu, or a --launcher that spans several nodes"
        )


def _recover_flags(args: argparse.Namespace, ctx: dict[str, Any]) -> None:
    """Copy the recovery flags into the context, refusing values out of range."""
    checks = {
        "recover_steps": (lambda v: 0 <= v <= 1_000_000, "must be in 0..1000000 (0: scaled to the data)"),
        "recover_minutes": (lambda v: 0 <= v <= 10_000, "must be in [0, 10000] minutes (0: no cap)"),
        "recover_lr": (lambda v: 0 < v <= 1, "must be in (0, 1]"),
        "recover_batch": (lambda v: 1 <= v <= 4096, "must be in 1..4096"),
        "recover_procs": (lambda v: 1 <= v <= 4096, "must be in 1..4096"),
        "launcher": (lambda v: bool(v.split()), "must name a command, e.g. 'torchrun --nproc-per-node {procs}'"),
    }
    for key, (ok, why) in checks.items():
        value = getattr(args, key, None)
        if value is not None and not ok(value):
            raise BadInput(f"invalid --{key.replace('_', '-')}: {why}")
        _set(ctx, key, value)
    _set(ctx, "recover", args.recover)
    if getattr(args, "no_augment", False):
        ctx["recover_augment"] = False


def _check_llm_flags(args: argparse.Namespace) -> None:
    for flag in ("llm_timeout", "llm_first_token_timeout", "llm_idle_timeout"):
        value = getattr(args, flag)
        if value is not None and not 0 < value <= 3600:
            raise BadInput(f"invalid --{flag.replace('_', '-')}: must be in (0, 3600] seconds")
    if args.llm_max_tokens is not None and not 64 <= args.llm_max_tokens <= 1_000_000:
        raise BadInput("invalid --llm-max-tokens: must be in 64..1000000")
    if args.llm_retries is not None and not 0 <= args.llm_retries <= 10:
        raise BadInput("invalid --llm-retries: must be in 0..10")
    if args.llm_tool_rounds is not None and not 0 <= args.llm_tool_rounds <= 50:
        raise BadInput("invalid --llm-tool-rounds: must be in 0..50")
    if args.temperature is not None and not 0 <= args.temperature <= 2:
        raise BadInput("invalid --temperature: must be in [0, 2]")
    if args.llm_api_key_env is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,127}", args.llm_api_key_env):
        raise BadInput("invalid --llm-api-key-env: give the name of an environment variable, not the key")
    if args.llm_base_url is not None and not args.llm_base_url.startswith(("http://", "https://")):
        raise BadInput("invalid --llm-base-url: must start with http:// or https://")
