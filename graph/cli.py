"""Command-line interface: run, resume, profile, evaluate and list runs (the CLI owns the console)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import shutil
import sys
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

from profiling_agent.graph.review import (
    decision_hint,
    format_request,
    pending_approval,
    pending_nodes,
    read_plan_file,
    resume_command,
)

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130
RUN_SETTINGS = "run.json"


class BadInput(Exception):
    """An error in what the user asked for: one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, no usage dump
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message}\n")


def _quiet_libraries() -> None:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    warnings.filterwarnings("ignore")
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------- parser


def _add_context_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run-dir", default="runs", help="folder holding one sub-folder per run (default: runs)")
    p.add_argument("--device", choices=["cpu", "cuda", "auto"], default=None, help="device (default: auto)")
    p.add_argument("--threads", type=int, default=None, help="torch threads for profiling and evaluation")
    p.add_argument("--llm-model", default=None, help="chat model name (default: $OPENAI_MODEL, else gpt-4o)")
    p.add_argument("--llm-base-url", default=None, help="OpenAI-compatible base URL (default: $OPENAI_BASE_URL)")
    p.add_argument(
        "--llm-api-key-env", default=None, help="environment variable holding the API key (default: OPENAI_API_KEY)"
    )
    p.add_argument("--llm-timeout", type=float, default=None, help="seconds per LLM request (default 60)")
    p.add_argument("--llm-retries", type=int, default=None, help="invalid LLM plans sent back before the fallback")
    p.add_argument("--llm-tool-rounds", type=int, default=None, help="LLM tool-call rounds per planning step")
    p.add_argument("--temperature", type=float, default=None, help="LLM sampling temperature")
    p.add_argument("--repeats", type=int, default=None, help="timed latency repeats (median reported)")


def _refuse_goal_flags(run: argparse.ArgumentParser, resume: argparse.ArgumentParser) -> None:
    """Accept run's goal flags on resume only to refuse them clearly: a resume cannot change what is optimized."""
    taken = {opt for action in resume._actions for opt in action.option_strings}
    for action in run._actions:
        opts = [opt for opt in action.option_strings if opt not in taken]
        if opts and not isinstance(action, argparse._HelpAction):
            kind: dict[str, Any] = {"action": "store_true"} if action.nargs == 0 else {}
            hidden = {"default": argparse.SUPPRESS, "help": argparse.SUPPRESS}
            resume.add_argument(*opts, dest=f"goal_{action.dest}", **hidden, **kind)


def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser of `profiling-agent`."""
    parser = _Parser(
        prog="profiling-agent",
        description="Profiling-guided pruning and quantization of HF image "
        "classifiers, driven by a LangGraph agent graph.",
    )
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)

    run = sub.add_parser("run", help="compress a model (no arguments: the embedded offline default)")
    run.add_argument("--model", default=None, help="hub id, save_pretrained folder, artifact, or embedded:NAME")
    run.add_argument("--dataset", default=None, help="hub id, save_to_disk folder, imagefolder, or embedded:digits")
    run.add_argument("--split", default=None, help="dataset split (default: test)")
    run.add_argument("--subset", type=int, default=None, help="evaluation images (seeded subset, default 512)")
    run.add_argument("--calibration", type=int, default=None, help="sensitivity-probe images (default 64)")
    run.add_argument("--image-column", default=None)
    run.add_argument("--label-column", default=None)
    run.add_argument("--seed", type=int, default=None)
    run.add_argument("--iterations", type=int, default=None, help="pruning iterations (default 5)")
    run.add_argument(
        "--planner",
        choices=["deterministic", "llm", "auto", "l1", "l2", "random"],
        default=None,
        help="l1/l2/random: uniform pruning baseline at --ratio (one iteration)",
    )
    run.add_argument("--ratio", type=float, default=None, help="pruning ratio of the l1/l2/random baselines, in (0, 1)")
    run.add_argument("--quantize", choices=["qint8", "float16", "none"], default=None)
    run.add_argument("--select", choices=["paper", "budget"], default=None, help="best-candidate rule")
    run.add_argument("--max-acc-drop", type=float, default=None, help="accuracy budget in percentage points")
    run.add_argument("--target", choices=["params", "macs", "latency", "size"], default=None)
    run.add_argument("--target-reduction", type=float, default=None, help="e.g. 0.4 = 40%% reduction of --target")
    run.add_argument("--trust-remote-code", action="store_true")
    run.add_argument("--thread-id", default=None, help="run id (default: generated)")
    run.add_argument("--approve", action="store_true", help="pause before each plan is applied for your decision")
    _add_context_flags(run)

    resume = sub.add_parser("resume", help="continue an interrupted run from its last checkpoint")
    resume.add_argument("thread_id")
    resume.add_argument("--decision", choices=["approve", "edit", "reject"], default=None, help="answer a paused plan")
    resume.add_argument("--plan", default=None, help="with --decision edit: the plan to apply instead (JSON file)")
    _add_context_flags(resume)  # "how" settings may change on resume
    _refuse_goal_flags(run, resume)

    prof = sub.add_parser("profile", help="profile a model and print its per-layer table")
    prof.add_argument("--model", default=None)
    prof.add_argument("--top", type=int, default=30)
    prof.add_argument("--device", choices=["cpu", "cuda", "auto"], default="auto")
    prof.add_argument("--json", dest="json_out", default=None, help="also write the full profile here")

    runs = sub.add_parser("runs", help="list runs and their status")
    runs.add_argument("--run-dir", default="runs")

    ev = sub.add_parser("evaluate", help="evaluate a model, a baseline or a saved compressed model")
    ev.add_argument("--model", required=True)
    ev.add_argument("--dataset", default=None)
    ev.add_argument("--split", default="test")
    ev.add_argument("--subset", type=int, default=512)
    ev.add_argument("--seed", type=int, default=0)
    ev.add_argument("--image-column", default=None)
    ev.add_argument("--label-column", default=None)
    ev.add_argument("--device", choices=["cpu", "cuda", "auto"], default="auto")
    ev.add_argument("--json", dest="json_out", default=None, help="write the metrics as JSON here")

    rep = sub.add_parser("report", help="rebuild plots, report.md and report.html of a finished run")
    rep.add_argument("run_path", metavar="RUN_DIR/THREAD_ID", help="the finished run's folder")
    return parser


# ------------------------------------------------------------------------------------------- helpers


def _set(target: dict[str, Any], key: str, value: Any) -> None:
    if value is not None:
        target[key] = value


def input_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """Build the graph input (model, dataset, objective) from the run flags, validated by the schemas."""
    from pydantic import ValidationError

    from profiling_agent.state import InputState

    model: dict[str, Any] = {}
    _set(model, "ref", args.model)
    if args.trust_remote_code:
        model["trust_remote_code"] = True
    dataset: dict[str, Any] = {}
    for key in ("split", "subset", "calibration", "image_column", "label_column", "seed"):
        _set(dataset, key, getattr(args, key))
    _set(dataset, "ref", args.dataset)
    objective: dict[str, Any] = {}
    for key in ("iterations", "planner", "ratio", "quantize", "select", "max_acc_drop", "target", "target_reduction"):
        _set(objective, key, getattr(args, key))
    if getattr(args, "approve", False):
        objective["approve"] = True
    try:
        return InputState(model=model, dataset=dataset, objective=objective).model_dump()
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
    _set(ctx, "llm_retries", args.llm_retries)
    _set(ctx, "llm_tool_rounds", args.llm_tool_rounds)
    _set(ctx, "llm_temperature", args.temperature)
    _check_llm_flags(args)
    _set(ctx, "latency_repeats", args.repeats)
    if args.threads is not None and args.threads < 1:
        raise BadInput("invalid --threads: must be at least 1")
    if args.repeats is not None and args.repeats < 1:
        raise BadInput("invalid --repeats: must be at least 1")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise BadInput("--device cuda was requested but no CUDA device is available")
    return ctx


def _check_llm_flags(args: argparse.Namespace) -> None:
    import re

    if args.llm_timeout is not None and not 0 < args.llm_timeout <= 3600:
        raise BadInput("invalid --llm-timeout: must be in (0, 3600] seconds")
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


def _context(ctx: dict[str, Any]):
    from profiling_agent.state import Context

    names = {f.name for f in dataclasses.fields(Context)}
    return Context(**{k: v for k, v in ctx.items() if k in names})


def _check_run_dir(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise BadInput(f"run folder {path} is not writable: {exc.strerror or exc}") from None


class _Progress:
    """Render custom progress events as tqdm bars on stderr and node updates as log lines."""

    def __init__(self) -> None:
        from tqdm import tqdm

        self._tqdm = tqdm
        self._bars: dict[str, Any] = {}
        self._enabled = sys.stderr.isatty()

    def progress(self, event: dict[str, Any]) -> None:
        task, total = event.get("task", ""), int(event.get("total") or 0)
        if not self._enabled or total <= 1:
            return
        bar = self._bars.get(task)
        if bar is None:
            bar = self._bars[task] = self._tqdm(total=total, desc=task, leave=False, file=sys.stderr)
        bar.n = int(event.get("done", 0))
        bar.set_postfix_str(str(event.get("label", ""))[:40])
        bar.refresh()
        if bar.n >= total:
            bar.close()
            self._bars.pop(task, None)

    def update(self, node: str, values: dict[str, Any] | None) -> None:
        for item in (values or {}).get("history") or []:
            it = item.get("iteration")
            prefix = f"[{item.get('node', node)}" + (f" #{it}" if it else "") + "]"
            _say(f"{prefix} {item.get('message', '')}")

    def close(self) -> None:
        for bar in self._bars.values():
            bar.close()


def _drive(graph: Any, payload: Any, config: dict[str, Any], context: Any, banner: list[str] | None = None) -> None:
    """Stream the graph to the console; `banner` is printed once the first node succeeds (bad input stays one line)."""
    progress = _Progress()
    banner = list(banner or [])
    try:
        for mode, chunk in graph.stream(
            payload, config, context=context, stream_mode=["updates", "custom"], durability="sync"
        ):
            if mode == "custom" and isinstance(chunk, dict) and chunk.get("kind") == "progress":
                progress.progress(chunk)
            elif mode == "updates" and isinstance(chunk, dict):
                while banner:
                    _say(banner.pop(0))
                for node, values in chunk.items():
                    progress.update(node, values if isinstance(values, dict) else None)
    finally:
        progress.close()


def _final_table(run_path: Path) -> str:
    from profiling_agent.tools.io import read_json
    from profiling_agent.tools.report import comparison_rows, format_table

    result = read_json(run_path / "result.json")
    lines = [format_table(comparison_rows(result)), ""]
    best = result.get("best")
    if best:
        lines.append(
            f"best: iteration {best['iteration']} ({best['rule']} rule"
            + ("" if best.get("within_budget") else ", NOT within the accuracy budget")
            + f"), {best['reduction']:.1%} {result['objective']['target']} reduction, "
            f"{best['accuracy_drop']:+.2f} pp accuracy drop; saved in {run_path / 'best'}"
        )
    lines.append(f"stopped: {result.get('stop_reason')}")
    lines.append(f"report: {run_path / 'report.md'}   result: {run_path / 'result.json'}")
    return "\n".join(lines)


def _looks_like_path(ref: str) -> bool:
    return ref.startswith(("/", "./", "../", "~")) or os.sep in ref and Path(ref).expanduser().exists()


def preflight(payload: dict[str, Any]) -> None:
    """Reject local model/dataset paths that do not exist before a thread is created."""
    for what, ref in (("model", payload["model"]["ref"]), ("dataset", payload["dataset"]["ref"])):
        if _looks_like_path(ref) and not Path(ref).expanduser().exists():
            raise BadInput(f"{what} path not found: {ref}")


def _new_thread_id(model_ref: str) -> str:
    stem = Path(model_ref.split(":")[-1].rstrip("/")).name.replace("/", "-")[:40] or "run"
    return f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"


# ------------------------------------------------------------------------------------------- commands


def cmd_run(args: argparse.Namespace) -> int:
    """Start a new run (a new thread) and drive it to the end."""
    from profiling_agent.graph.builder import build_graph
    from profiling_agent.graph.checkpoint import open_checkpointer, thread_ids
    from profiling_agent.tools.io import write_json_atomic

    payload = input_from_args(args)
    preflight(payload)
    ctx = context_from_args(args)
    root = Path(ctx["run_root"])
    _check_run_dir(root)
    from profiling_agent.tools.llm_planner import planner_mode

    try:  # auto: the LLM when one is configured; llm without one: one-line error naming the missing setting
        _mode, planner_note = planner_mode(payload["objective"]["planner"], _context(ctx))
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    thread_id = args.thread_id = args.thread_id or _new_thread_id(payload["model"]["ref"])
    saver = open_checkpointer(root)
    if thread_id in thread_ids(saver):
        raise BadInput(f"thread {thread_id} already exists in {root}: use `{resume_command(thread_id, args.run_dir)}`")
    write_json_atomic(root / thread_id / RUN_SETTINGS, {"thread_id": thread_id, "input": payload, "context": ctx})
    banner = [
        f"run {thread_id} -> {root / thread_id}  (resume with: {resume_command(thread_id, args.run_dir)})",
        f"planner: {planner_note}",
    ]
    graph = build_graph(checkpointer=saver)
    config = {"configurable": {"thread_id": thread_id}}
    try:
        _drive(graph, payload, config, _context(ctx), banner)
    except _expected_errors():
        if pending_nodes(graph.get_state(config)) == ("acquire",):  # bad model/dataset: leave no half-made thread
            saver.delete_thread(thread_id)
            shutil.rmtree(root / thread_id, ignore_errors=True)
        raise
    if _paused(graph, config, root, thread_id, args.run_dir):
        return EXIT_OK
    print(_final_table(root / thread_id))
    return EXIT_OK


def _paused(graph: Any, config: dict[str, Any], root: Path, thread_id: str, run_dir: str) -> bool:
    """Show the plan a run is waiting on, with the commands that answer it; return False when not paused."""
    request = pending_approval(graph.get_state(config))
    if request is None:
        return False
    print(format_request(request, root / thread_id))
    _say(decision_hint(thread_id, run_dir))
    return True


def _resume_payload(args: argparse.Namespace, snapshot: Any, root: Path) -> Any:
    """Check resume's flags against the thread and return what to stream: None, or Command(resume=answer)."""
    from langgraph.types import Command

    tid = args.thread_id
    request = pending_approval(snapshot)
    if args.decision is None:
        if request is not None:
            raise BadInput(
                f"thread {tid} is waiting for approval of iteration {request['iteration']}'s plan "
                f"({root / tid / request['plan_file']}): pass --decision approve|edit|reject"
            )
        return None
    if request is None:
        nodes = pending_nodes(snapshot)
        where = f"next: {', '.join(nodes)}" if nodes else "it has nothing left to run"
        raise BadInput(f"thread {tid} is not waiting for approval ({where}): drop --decision")
    answer: dict[str, Any] = {"decision": args.decision}
    if args.decision == "edit":
        answer["plan"] = read_plan_file(args.plan, root / tid / "profile.json")
    return Command(resume=answer)


def cmd_resume(args: argparse.Namespace) -> int:
    """Continue a thread from its last checkpoint with the settings it was started with."""
    from profiling_agent.graph.builder import build_graph
    from profiling_agent.graph.checkpoint import open_checkpointer, thread_ids
    from profiling_agent.tools.io import read_json

    goal_flags = sorted("--" + key[len("goal_") :].replace("_", "-") for key in vars(args) if key.startswith("goal_"))
    if goal_flags:
        raise BadInput(
            f"resume continues thread {args.thread_id} with the model, dataset and objective it started with: "
            f"{', '.join(goal_flags)} cannot change them (start a new run, or fork the thread with the Python API)"
        )
    if args.plan is not None and args.decision != "edit":
        raise BadInput("--plan goes with --decision edit")
    if args.decision == "edit" and args.plan is None:
        raise BadInput("--decision edit needs --plan FILE.json (e.g. an edited copy of the pending plan.json)")
    root = Path(args.run_dir).resolve()
    if not (root / "checkpoints.sqlite").exists():
        raise BadInput(f"no runs in {root}")
    saver = open_checkpointer(root)
    if args.thread_id not in thread_ids(saver):
        raise BadInput(
            f"unknown thread {args.thread_id} in {root} (see `profiling-agent runs --run-dir {args.run_dir}`)"
        )
    settings_path = root / args.thread_id / RUN_SETTINGS
    ctx = read_json(settings_path)["context"] if settings_path.exists() else {}
    ctx.update(context_from_args(args))  # flags given now override the saved "how" settings
    graph = build_graph(checkpointer=saver)
    config = {"configurable": {"thread_id": args.thread_id}}
    snapshot = graph.get_state(config)
    payload = _resume_payload(args, snapshot, root)
    if not pending_nodes(snapshot):  # not snapshot.next: that misses a step whose writes were saved
        if (snapshot.values or {}).get("status") == "done":
            _say(f"run {args.thread_id} is already finished")
            print(_final_table(root / args.thread_id))
            return EXIT_OK
        raise BadInput(f"thread {args.thread_id} has nothing to resume")
    where = ", ".join(pending_nodes(snapshot))
    _say(f"resuming {args.thread_id} at {where} (iteration {snapshot.values.get('iteration', 0)})")
    _drive(graph, payload, config, _context(ctx))
    if _paused(graph, config, root, args.thread_id, args.run_dir):
        return EXIT_OK
    print(_final_table(root / args.thread_id))
    return EXIT_OK


def cmd_runs(args: argparse.Namespace) -> int:
    """List the threads under a run folder."""
    from profiling_agent.graph.builder import build_graph
    from profiling_agent.graph.checkpoint import open_checkpointer, thread_ids, thread_summary
    from profiling_agent.tools.report import format_table

    root = Path(args.run_dir).resolve()
    if not (root / "checkpoints.sqlite").exists():
        _say(f"no runs in {root}")
        return EXIT_OK
    saver = open_checkpointer(root)
    graph = build_graph(checkpointer=saver)
    rows = [["thread", "status", "iteration", "next", "best", "top-1 %", "model", "updated"]]
    for tid in thread_ids(saver):
        s = thread_summary(graph, tid)
        acc = s["best_accuracy"]
        rows.append(
            [
                tid,
                s["status"],
                f"{s['iteration']}/{s['iterations'] or '-'}",
                ",".join(s["next"]) or "-",
                str(s["best_iteration"] or "-"),
                f"{acc:.2f}" if acc is not None else "-",
                str(s["model"]),
                s["updated"],
            ]
        )
    print(format_table(rows))
    return EXIT_OK


def cmd_profile(args: argparse.Namespace) -> int:
    """Profile one model and print the per-layer table."""
    from profiling_agent.state import EMBEDDED_MODEL
    from profiling_agent.tools.device import resolve_device
    from profiling_agent.tools.io import write_json_atomic
    from profiling_agent.tools.models import load_model, resolve_input_shape, verify_input_shape
    from profiling_agent.tools.profiling import format_layer_table, profile_model

    loaded = load_model(args.model or EMBEDDED_MODEL)
    shape = resolve_input_shape(loaded.model, loaded.processor)
    verify_input_shape(loaded.model, shape)
    device = resolve_device(args.device)
    prof = profile_model(
        loaded.model.to(device), (shape["channels"], shape["height"], shape["width"]), device=str(device)
    )
    if args.json_out:
        write_json_atomic(args.json_out, prof)
    print(format_layer_table(prof, top=args.top))
    return EXIT_OK


def cmd_evaluate(args: argparse.Namespace) -> int:
    """Evaluate a model (baseline or saved artifact) on a dataset: accuracy, latency, size, params, MACs."""
    import tempfile

    from profiling_agent.state import EMBEDDED_DATASET
    from profiling_agent.tools.evaluate_model import evaluate_model
    from profiling_agent.tools.io import write_json_atomic
    from profiling_agent.tools.report import format_table

    with tempfile.TemporaryDirectory() as tmp:
        metrics = evaluate_model(
            args.model,
            args.dataset or EMBEDDED_DATASET,
            split=args.split,
            subset=args.subset,
            seed=args.seed,
            image_column=args.image_column,
            label_column=args.label_column,
            device=args.device,
            work_dir=Path(tmp),
        )
    rows = [["metric", "value"]] + [[k, f"{v:.4f}" if isinstance(v, float) else str(v)] for k, v in metrics.items()]
    print(format_table(rows))
    if args.json_out:
        write_json_atomic(args.json_out, metrics)
    return EXIT_OK


def cmd_report(args: argparse.Namespace) -> int:
    """Rebuild plots, report.md and report.html of a finished run from its files, re-running nothing."""
    from profiling_agent.tools.report_html import rebuild_report

    root = Path(args.run_path)
    files = rebuild_report(root)
    print(f"report: {root / files['html']}   markdown: {root / files['markdown']}   plots: {len(files['plots'])}")
    return EXIT_OK


COMMANDS = {"run": cmd_run, "resume": cmd_resume, "runs": cmd_runs, "profile": cmd_profile, "evaluate": cmd_evaluate}
COMMANDS["report"] = cmd_report


def _expected_errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = [BadInput, FileNotFoundError]
    for module, name in (
        ("profiling_agent.tools.models", "ModelLoadError"),
        ("profiling_agent.tools.data", "DataError"),
        ("profiling_agent.tools.artifacts", "ArtifactError"),
    ):
        try:
            errors.append(getattr(__import__(module, fromlist=[name]), name))
        except (ImportError, AttributeError):
            pass
    return tuple(errors)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; return the exit code (0 done, 1 failed, 2 bad input, 130 interrupted)."""
    _quiet_libraries()
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        args = parser.parse_args(["run", *(argv or [])])
    try:
        return COMMANDS[args.command](args)
    except KeyboardInterrupt:
        tid = getattr(args, "thread_id", None)
        resumable = tid and args.command in ("run", "resume")
        hint = f": resume with `{resume_command(tid, args.run_dir)}`" if resumable else ""
        _say(f"interrupted{hint}")
        return EXIT_INTERRUPTED
    except _expected_errors() as exc:
        _say(f"profiling-agent: error: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
        return EXIT_BAD_INPUT
    except ValueError as exc:
        _say(f"profiling-agent: error: {str(exc).splitlines()[0]}")
        return EXIT_BAD_INPUT
    except Exception as exc:  # unexpected: one line plus where the details are, never a bare traceback
        logging.getLogger(__name__).debug("unexpected failure", exc_info=True)
        _say(
            f"profiling-agent: failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            " (set PROFILING_AGENT_DEBUG=1 for the traceback)"
        )
        if os.environ.get("PROFILING_AGENT_DEBUG"):
            raise
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
