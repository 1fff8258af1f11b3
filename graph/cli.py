"""Command-line interface: run, resume, profile, evaluate and list runs (the CLI owns the console)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

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
    p.add_argument("--llm-model", default=None, help="chat model name (default: gpt-4o)")
    p.add_argument("--llm-base-url", default=None, help="OpenAI-compatible base URL (default: $OPENAI_BASE_URL)")
    p.add_argument("--llm-timeout", type=float, default=None, help="seconds per LLM request")
    p.add_argument("--temperature", type=float, default=None, help="LLM sampling temperature")
    p.add_argument("--repeats", type=int, default=None, help="timed latency repeats (median reported)")


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
    run.add_argument("--planner", choices=["deterministic", "llm", "auto"], default=None)
    run.add_argument("--quantize", choices=["qint8", "float16", "none"], default=None)
    run.add_argument("--select", choices=["paper", "budget"], default=None, help="best-candidate rule")
    run.add_argument("--max-acc-drop", type=float, default=None, help="accuracy budget in percentage points")
    run.add_argument("--target", choices=["params", "macs", "latency", "size"], default=None)
    run.add_argument("--target-reduction", type=float, default=None, help="e.g. 0.4 = 40%% reduction of --target")
    run.add_argument("--trust-remote-code", action="store_true")
    run.add_argument("--thread-id", default=None, help="run id (default: generated)")
    _add_context_flags(run)

    resume = sub.add_parser("resume", help="continue an interrupted run from its last checkpoint")
    resume.add_argument("thread_id")
    resume.add_argument("--run-dir", default="runs")

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
    for key in ("iterations", "planner", "quantize", "select", "max_acc_drop", "target", "target_reduction"):
        _set(objective, key, getattr(args, key))
    try:
        return InputState(model=model, dataset=dataset, objective=objective).model_dump()
    except ValidationError as exc:
        err = exc.errors()[0]
        where = "--" + str(err["loc"][-1]).replace("_", "-")
        raise BadInput(f"invalid {where}: {err['msg']}") from None


def context_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """Build the run context from flags (only the flags given; defaults come from Context)."""
    ctx: dict[str, Any] = {"run_root": str(Path(args.run_dir).resolve())}
    _set(ctx, "device", args.device)
    _set(ctx, "threads", args.threads)
    _set(ctx, "llm_model", args.llm_model)
    _set(ctx, "llm_base_url", args.llm_base_url)
    _set(ctx, "llm_timeout", args.llm_timeout)
    _set(ctx, "llm_temperature", args.temperature)
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


def _drive(graph: Any, payload: Any, config: dict[str, Any], context: Any) -> None:
    progress = _Progress()
    try:
        for mode, chunk in graph.stream(
            payload, config, context=context, stream_mode=["updates", "custom"], durability="sync"
        ):
            if mode == "custom" and isinstance(chunk, dict) and chunk.get("kind") == "progress":
                progress.progress(chunk)
            elif mode == "updates" and isinstance(chunk, dict):
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
    if payload["objective"]["planner"] == "llm":
        from profiling_agent.nodes.analyze import llm_configured

        if not llm_configured(_context(ctx)):
            raise BadInput(
                "--planner llm needs an LLM endpoint: set OPENAI_BASE_URL or OPENAI_API_KEY, or pass --llm-base-url"
            )
    thread_id = args.thread_id = args.thread_id or _new_thread_id(payload["model"]["ref"])
    saver = open_checkpointer(root)
    if thread_id in thread_ids(saver):
        raise BadInput(f"thread {thread_id} already exists in {root}: use `profiling-agent resume {thread_id}`")
    write_json_atomic(root / thread_id / RUN_SETTINGS, {"thread_id": thread_id, "input": payload, "context": ctx})
    _say(
        f"run {thread_id} -> {root / thread_id}  (resume with: profiling-agent resume {thread_id}"
        + ("" if args.run_dir == "runs" else f" --run-dir {args.run_dir}")
        + ")"
    )
    graph = build_graph(checkpointer=saver)
    _drive(graph, payload, {"configurable": {"thread_id": thread_id}}, _context(ctx))
    print(_final_table(root / thread_id))
    return EXIT_OK


def cmd_resume(args: argparse.Namespace) -> int:
    """Continue a thread from its last checkpoint with the settings it was started with."""
    from profiling_agent.graph.builder import build_graph
    from profiling_agent.graph.checkpoint import open_checkpointer, thread_ids
    from profiling_agent.tools.io import read_json

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
    ctx["run_root"] = str(root)
    graph = build_graph(checkpointer=saver)
    config = {"configurable": {"thread_id": args.thread_id}}
    snapshot = graph.get_state(config)
    if not snapshot.next:
        if (snapshot.values or {}).get("status") == "done":
            _say(f"run {args.thread_id} is already finished")
            print(_final_table(root / args.thread_id))
            return EXIT_OK
        raise BadInput(f"thread {args.thread_id} has nothing to resume")
    _say(f"resuming {args.thread_id} at {', '.join(snapshot.next)} (iteration {snapshot.values.get('iteration', 0)})")
    _drive(graph, None, config, _context(ctx))
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


COMMANDS = {"run": cmd_run, "resume": cmd_resume, "runs": cmd_runs, "profile": cmd_profile, "evaluate": cmd_evaluate}


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
        hint = f": resume with `profiling-agent resume {tid}`" if tid and args.command in ("run", "resume") else ""
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
