"""Command-line interface: run, resume, profile, evaluate and list runs (the CLI owns the console)."""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sqlite3
import sys
import tempfile
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

from profiling_agent.graph.checkpoint import (
    DB_NAME,
    CheckpointDatabaseError,
    has_checkpoints,
    migrate_checkpoint,
    thread_ids,
    writable,
)
from profiling_agent.graph.cli.args import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    RUN_SETTINGS,
    BadInput,
    build_parser,
    context_from_args,
    input_from_args,
    subset_size,
    thread_id_arg,
)
from profiling_agent.graph.cli.console import (
    drive_graph,
    fault,
    final_table,
    force_exit,
    resume_line,
    say,
    stopped_line,
)
from profiling_agent.graph.cli.crashes import StepCrashed, set_aside_line
from profiling_agent.graph.cli.export import cmd_export
from profiling_agent.graph.cli.listing import cmd_runs
from profiling_agent.graph.cli.store import checkpoint_url, checkpoints, resume_hint, runs_hint, shown_url, store_name
from profiling_agent.graph.review import (
    decision_hint,
    format_request,
    pending_approval,
    pending_nodes,
    read_plan_file,
)
from profiling_agent.graph.thread_lock import thread_lock
from profiling_agent.state import EMBEDDED_DATASET, EMBEDDED_MODEL, Context
from profiling_agent.tools import interrupt, run_layout
from profiling_agent.tools.hub import looks_like_path
from profiling_agent.tools.io import MachineFault, read_json, write_json_atomic
from profiling_agent.tools.planning.llm_config import planner_mode
from profiling_agent.tools.profiling.summary import format_layer_table
from profiling_agent.tools.reporting.files import rebuild_report
from profiling_agent.tools.reporting.markdown import format_table
from profiling_agent.tools.runtimes.telemetry import disable_telemetry


def _quiet_libraries() -> None:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    warnings.filterwarnings("ignore")
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    embedded = logging.getLogger("profiling_agent.tools.models.embedded")  # first-use training: show progress
    if not embedded.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        embedded.addHandler(handler)
        embedded.setLevel(logging.INFO)
        embedded.propagate = False


def _check_run_dir(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise BadInput(f"run folder {path} is not writable: {exc.strerror or exc}") from None


def preflight(payload: dict[str, Any]) -> None:
    """Reject local model/dataset paths that do not exist before a thread is created."""
    for what, ref in (("model", payload["model"]["ref"]), ("dataset", payload["dataset"]["ref"])):
        if looks_like_path(ref) and not Path(ref).expanduser().exists():
            raise BadInput(f"{what} path not found: {ref}")


def _new_thread_id(model_ref: str) -> str:
    stem = Path(model_ref.split(":")[-1].rstrip("/")).name.replace("/", "-")[:40] or "run"
    return f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"


# ------------------------------------------------------------------------------------------- commands


def cmd_run(args: argparse.Namespace) -> int:
    """Start a new run (a new thread) and drive it to the end."""
    if args.thread_id is not None:
        thread_id_arg(args.thread_id)
    payload = input_from_args(args)
    preflight(payload)
    ctx = context_from_args(args)
    root = Path(ctx["run_root"])
    _check_run_dir(root)

    try:  # auto: the LLM when one is configured; llm without one: one-line error naming the missing setting
        planner_note = planner_mode(payload["objective"]["planner"], Context.of(ctx)).note
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    thread_id = args.thread_id = args.thread_id or _new_thread_id(payload["model"]["ref"])
    url = checkpoint_url(args)
    with checkpoints(root, url) as saver, thread_lock(saver, root, thread_id):
        if thread_id in thread_ids(saver):
            where = store_name(root, url)
            raise BadInput(f"thread {thread_id} already exists in {where}: use `{resume_hint(args, thread_id)}`")
        write_json_atomic(root / thread_id / RUN_SETTINGS, {"thread_id": thread_id, "input": payload, "context": ctx})
        banner = [
            f"run {thread_id} -> {root / thread_id}  (resume with: {resume_hint(args, thread_id)})",
            f"planner: {planner_note}",
        ]
        from profiling_agent.graph.builder import (
            build_graph,
        )  # lazy: langgraph's runtime (langsmith, httpx); the CLI's flag check runs without it

        graph = build_graph(checkpointer=saver)
        config = {"configurable": {"thread_id": thread_id}}
        try:
            with interrupt.fault_log(root / thread_id):  # a native fault leaves every thread's stack there
                drive_graph(graph, payload, config, Context.of(ctx), banner)
        except _expected_errors():
            if pending_nodes(graph.get_state(config)) == ("acquire",):  # bad model/dataset: leave no half-made thread
                saver.delete_thread(thread_id)
                shutil.rmtree(root / thread_id, ignore_errors=True)
            raise
        if _paused(graph, config, root, args):
            return EXIT_OK
    print(final_table(root / thread_id))
    return EXIT_OK


def _paused(graph: Any, config: dict[str, Any], root: Path, args: argparse.Namespace) -> bool:
    """Show the plan a run is waiting on, with the commands that answer it; return False when not paused."""
    request = pending_approval(graph.get_state(config))
    if request is None:
        return False
    print(format_request(request, root / args.thread_id))
    say(decision_hint(args.thread_id, args.run_dir, shown_url(args)))
    return True


def _resume_payload(args: argparse.Namespace, snapshot: Any, root: Path) -> Any:
    """Check resume's flags against the thread and return what to stream: None, or Command(resume=answer)."""
    from langgraph.types import (
        Command,
    )  # lazy: langgraph's runtime (langsmith, httpx); the CLI's flag check runs without it

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
        answer["plan"] = read_plan_file(args.plan, root / tid / run_layout.PROFILE)
    return Command(resume=answer)


def _resume_read_only(args: argparse.Namespace, root: Path) -> int:
    """Resume in a read-only run folder: a finished thread says so; any other cannot go on there (exit 2)."""
    from profiling_agent.graph.builder import (
        build_graph,
    )  # lazy: langgraph's runtime (langsmith, httpx); the CLI's flag check runs without it

    with checkpoints(root, None, read_only=True) as saver:
        if args.thread_id not in thread_ids(saver):
            raise BadInput(f"unknown thread {args.thread_id} in {root} (see `{runs_hint(args)}`)")
        graph = build_graph(checkpointer=saver, read_only=True)  # reads the state: imports no step
        snapshot = graph.get_state({"configurable": {"thread_id": args.thread_id}})
    if not pending_nodes(snapshot) and (snapshot.values or {}).get("status") == "done":
        say(f"run {args.thread_id} is already finished")
        print(final_table(root / args.thread_id))
        return EXIT_OK
    raise BadInput(f"run folder {root} is read-only: thread {args.thread_id} cannot go on there (make it writable)")


def cmd_resume(args: argparse.Namespace) -> int:
    """Continue a thread from its last checkpoint with the settings it was started with."""
    thread_id_arg(args.thread_id)
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
    url = checkpoint_url(args)
    if not has_checkpoints(root, url):
        raise BadInput(f"no runs in {root}")
    if url is None and not writable(root):
        return _resume_read_only(args, root)
    with checkpoints(root, url) as saver:
        if args.thread_id not in thread_ids(saver):
            raise BadInput(f"unknown thread {args.thread_id} in {store_name(root, url)} (see `{runs_hint(args)}`)")
        with thread_lock(saver, root, args.thread_id):  # before reading the state: the holder may be changing it
            return _resume_locked(args, saver, root)


def _resume_locked(args: argparse.Namespace, saver: Any, root: Path) -> int:
    """Resume a thread this process holds the lock of."""
    from profiling_agent.graph.builder import (
        build_graph,
    )  # lazy: langgraph's runtime (langsmith, httpx); the CLI's flag check runs without it

    settings_path = root / args.thread_id / RUN_SETTINGS
    ctx = read_json(settings_path)["context"] if settings_path.exists() else {}
    ctx.update(context_from_args(args))  # flags given now override the saved "how" settings
    graph = build_graph(checkpointer=saver)
    config = {"configurable": {"thread_id": args.thread_id}}
    for change in migrate_checkpoint(graph, saver, config):  # a checkpoint written in an older state format
        say(f"thread {args.thread_id} was saved by an older version: {change}")
    snapshot = graph.get_state(config)
    payload = _resume_payload(args, snapshot, root)
    if not pending_nodes(snapshot):  # not snapshot.next: that misses a step whose writes were saved
        if (snapshot.values or {}).get("status") == "done":
            say(f"run {args.thread_id} is already finished")
            print(final_table(root / args.thread_id))
            return EXIT_OK
        raise BadInput(f"thread {args.thread_id} has nothing to resume")
    where = ", ".join(pending_nodes(snapshot))
    resume = resume_hint(args, args.thread_id)
    line = set_aside_line(root / args.thread_id, args.thread_id, where, resume)
    if line is not None:  # the process that ran it last died by a signal: said once, its stacks kept aside
        say(line)
    say(f"resuming {args.thread_id} at {where} (iteration {snapshot.values.get('iteration', 0)})")
    with interrupt.fault_log(root / args.thread_id):
        drive_graph(graph, payload, config, Context.of(ctx))
    if _paused(graph, config, root, args):
        return EXIT_OK
    print(final_table(root / args.thread_id))
    return EXIT_OK


def cmd_profile(args: argparse.Namespace) -> int:
    """Profile one model and print the per-layer table."""
    from profiling_agent.tools.device import resolve_device  # lazy: torch; the CLI's flag check runs without it
    from profiling_agent.tools.models.input_shape import (
        resolve_input_shape,
        verify_input_shape,
    )  # lazy: torch; the CLI's flag check runs without it
    from profiling_agent.tools.models.loading import load_model  # lazy: torch; the CLI's flag check runs without it
    from profiling_agent.tools.profiling.dynamic import (
        profile_model,
    )  # lazy: torch; the CLI's flag check runs without it

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


def run_images(run_path: Path, part: str, dataset: str | None) -> tuple[str, str, list[int]]:
    """Return the dataset, split and rows a finished run used for `part` (validation or test), from subsets.json."""
    path = run_path / run_layout.SUBSETS
    if not path.is_file():
        raise BadInput(f"--from-run: {path} not found (a run folder RUN_DIR/THREAD_ID that prepared its data)")
    subsets = read_json(path)
    return dataset or subsets["dataset"], subsets[part]["split"], [int(i) for i in subsets[part]["indices"]]


def cmd_evaluate(args: argparse.Namespace) -> int:
    """Evaluate a model (baseline or saved artifact) on a dataset: accuracy, latency, size, params, MACs."""
    from profiling_agent.tools.evaluation.evaluate_model import (
        EvalRequest,
        evaluate_model,
    )  # lazy: torch; the CLI's flag check runs without it

    dataset, split, rows = args.dataset or EMBEDDED_DATASET, args.split, None
    if args.from_run:
        dataset, split, rows = run_images(Path(args.from_run), args.part, args.dataset)
    with tempfile.TemporaryDirectory() as tmp:
        request = EvalRequest(
            args.model,
            dataset,
            Path(tmp),
            split=split,
            subset=subset_size(args.subset) or 0,
            rows=rows,
            seed=args.seed,
            image_column=args.image_column,
            label_column=args.label_column,
            device=args.device,
        )
        metrics = evaluate_model(request)
    table = [["metric", "value"]] + [[k, f"{v:.4f}" if isinstance(v, float) else str(v)] for k, v in metrics.items()]
    print(format_table(table))
    if args.json_out:
        write_json_atomic(args.json_out, metrics)
    return EXIT_OK


def cmd_report(args: argparse.Namespace) -> int:
    """Rebuild plots, report.md and report.html of a finished run from its files, re-running nothing."""
    root = Path(args.run_path)
    if (root / run_layout.RESULT).is_file() and not writable(root):
        raise BadInput(f"run folder {root} is read-only: `report` rewrites plots/, report.md and report.html there")
    files = rebuild_report(root)
    print(f"report: {root / files['html']}   markdown: {root / files['markdown']}   plots: {len(files['plots'])}")
    return EXIT_OK


COMMANDS = {"run": cmd_run, "resume": cmd_resume, "runs": cmd_runs, "profile": cmd_profile, "evaluate": cmd_evaluate}
COMMANDS["report"] = cmd_report


def _cmd_export(args: argparse.Namespace) -> int:
    return cmd_export(args)


COMMANDS["export"] = _cmd_export


def _expected_errors() -> tuple[type[BaseException], ...]:
    """Return the errors that are the user's input (one line, exit 2) of the modules this process imported.

    An error class exists only once its module is imported, so a module not imported yet raised nothing here:
    looking it up in `sys.modules` keeps a rejected flag from importing torch (seconds) just to name the error.
    """
    errors: list[type[BaseException]] = [BadInput, FileNotFoundError]
    for module, name in (
        ("profiling_agent.graph.checkpoint_pg", "CheckpointStoreError"),
        ("profiling_agent.graph.thread_lock", "ThreadBusy"),
        ("profiling_agent.tools.models.loading", "ModelLoadError"),
        ("profiling_agent.tools.data.sources", "DataError"),
        ("profiling_agent.tools.models.artifacts", "ArtifactError"),
    ):
        error = getattr(sys.modules.get(module), name, None)
        if isinstance(error, type) and issubclass(error, BaseException):
            errors.append(error)
    return tuple(errors)


STOP_GRACE_S = 10.0  # after Ctrl-C, seconds the running step has to stop by itself before the CLI exits anyway


def damaged_advice(args: argparse.Namespace) -> str:
    """Say what works after a damaged checkpoint database: keep it aside, list runs again, start a run again."""
    root = Path(getattr(args, "run_dir", None) or "runs")
    db = root / DB_NAME
    thread = getattr(args, "thread_id", None) or "THREAD"
    return (
        f"keep it for inspection with `mv {db} {db}.damaged`; then `profiling-agent runs --run-dir {root}` works "
        f"again (listing no runs) and a run starts again from its folder: `profiling-agent run --thread-id {thread} "
        f"--run-dir {root}` with the model, dataset and objective saved in {root / thread / RUN_SETTINGS}"
    )


def _run_command(args: argparse.Namespace) -> int:
    """Run the chosen command; map every failure to one line and an exit code."""
    try:
        return COMMANDS[args.command](args)
    except KeyboardInterrupt as exc:  # Ctrl-C, SIGTERM, or a step that saw the stop request (tools.interrupt)
        say(stopped_line(args, str(exc)))
        return EXIT_INTERRUPTED
    except CheckpointDatabaseError as exc:  # no resume command: the database that would resume is the broken file
        say(f"profiling-agent: error: {exc}; {damaged_advice(args)}")
        return EXIT_FAILED
    except (MachineFault, StepCrashed, interrupt.ChildCrashed) as exc:  # a full disk (tools.io), a child's crash: named
        return fault(args, str(exc))
    except _expected_errors() as exc:
        say(f"profiling-agent: error: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
        return EXIT_BAD_INPUT
    except ValueError as exc:
        say(f"profiling-agent: error: {str(exc).splitlines()[0]}")
        return EXIT_BAD_INPUT
    except sqlite3.DatabaseError as exc:  # damaged, or read-only under a writer: name the file
        where = Path(getattr(args, "run_dir", None) or "runs").resolve() / DB_NAME
        return fault(args, f"checkpoint database {where}: {str(exc).splitlines()[0]}")
    except OSError as exc:  # a full disk, a read-only or vanished folder: the machine's fault, named
        named = f": {exc.filename}" if exc.filename else ""
        return fault(args, f"{exc.strerror or str(exc).splitlines()[0]}{named}")
    except Exception as exc:  # unexpected: one line plus where the details are, never a bare traceback
        logging.getLogger(__name__).debug("unexpected failure", exc_info=True)
        hint = resume_line(args)
        say(
            f"profiling-agent: failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            " (set PROFILING_AGENT_DEBUG=1 for the traceback" + (f"; {hint})" if hint else ")")
        )
        if os.environ.get("PROFILING_AGENT_DEBUG"):
            raise
        return EXIT_FAILED


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; return the exit code (0 done, 1 failed, 2 bad input, 130 interrupted or terminated).

    Without a command it prints the help (exit 0); Ctrl-C and SIGTERM stop the running step within moments
    (tools.interrupt) and print the resume command; a second one, or STOP_GRACE_S seconds without the step
    stopping (library code that never reaches a check), stops the process at once: every file is written
    atomically, so that is as safe as a SIGKILL.
    """
    disable_telemetry()  # before anything imports openvino or nncf; children import the package and do the same
    _quiet_libraries()
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return EXIT_OK
    with interrupt.stop_on_signals(on_second=force_exit(args), grace_s=STOP_GRACE_S):
        return _run_command(args)


def entry() -> None:
    """Run the CLI as a program (the `profiling-agent` script).

    After a stop (exit 130) the process ends at once: everything is closed and written by then, and the
    interpreter's teardown of a large heap took 20 s on a busy machine, which Ctrl-C should not wait for.
    """
    code = main()
    if code == EXIT_INTERRUPTED:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
