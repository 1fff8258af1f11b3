"""Console side of human approval and resume checks: pending plans, user plan files, the resume command."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from profiling_agent.state import CompressionPlan
from profiling_agent.tools.io import read_json
from profiling_agent.tools.planning.review import review_plan, unwrap_plan
from profiling_agent.tools.text import percent

MAX_PLAN_BYTES = 1_000_000


def resume_command(thread_id: str, run_dir: str = "runs", checkpoint_url: str | None = None) -> str:
    """Return the shell command that resumes `thread_id` (naming --run-dir when it is not the default).

    `checkpoint_url` is the --checkpoint-url given on the command line, printed as given (pass it redacted).
    """
    cmd = f"profiling-agent resume {shlex.quote(thread_id)}"
    cmd = cmd if run_dir == "runs" else f"{cmd} --run-dir {shlex.quote(str(run_dir))}"
    return f"{cmd} --checkpoint-url {shlex.quote(checkpoint_url)}" if checkpoint_url else cmd


def pending_nodes(snapshot: Any) -> tuple[str, ...]:
    """Return the nodes a thread still has to run or finish, including steps whose writes are saved.

    `snapshot.next` leaves out a step that finished (its writes saved) just before the process stopped and
    the step's checkpoint was written; such a thread still has to be resumed, so use the tasks.
    """
    return tuple(dict.fromkeys(task.name for task in getattr(snapshot, "tasks", None) or ()))


def pending_approval(snapshot: Any) -> dict[str, Any] | None:
    """Return the approval request a thread is paused on (the approve node's interrupt payload), or None."""
    for item in getattr(snapshot, "interrupts", None) or ():
        value = getattr(item, "value", None)
        if isinstance(value, dict) and value.get("kind") == "approve_plan":
            return value
    return None


def format_request(request: dict[str, Any], run_path: Path) -> str:
    """Render an approval request: the plan's entries, its estimated reductions and where its file is."""
    est = request.get("estimate") or {}
    plan = request.get("plan") or {}
    lines = [
        f"iteration {request.get('iteration')}/{request.get('iterations')}: {request.get('planner')} plan waiting "
        "for approval (estimated pruning reduction: "
        f"params {percent(est.get('params'), 0)}, MACs {percent(est.get('macs'), 0)}, "
        f"latency {percent(est.get('latency'), 0)})"
    ]
    for entry in plan.get("pruning") or []:
        ratio = float(entry.get("ratio", 0))
        lines.append(f"  prune     {entry.get('type', ''):<10} {ratio:.3f}  {entry.get('layer')}")
    for entry in plan.get("quantization") or []:
        lines.append(f"  quantize  {entry.get('dtype', ''):<10} {'':5}  {entry.get('layer')}")
    if not plan.get("pruning") and not plan.get("quantization"):
        lines.append("  (empty plan)")
    for note in request.get("guard_notes") or []:
        lines.append(f"  note: {note}")
    lines.append(f"plan: {run_path / str(request.get('plan_file', ''))}")
    return "\n".join(lines)


def decision_hint(thread_id: str, run_dir: str = "runs", checkpoint_url: str | None = None) -> str:
    """Return the one-line instruction printed while a run waits for approval."""
    cmd = resume_command(thread_id, run_dir, checkpoint_url)
    return f"waiting for approval: {cmd} --decision approve|reject, or --decision edit --plan FILE.json"


def read_plan_file(path: str, profile_path: Path) -> dict[str, Any]:
    """Read and check a user plan file (a CompressionPlan, or an iter_NN/plan.json document holding one).

    The plan is validated by the CompressionPlan schema, then by the plan guard against the run's profile
    (regex safety, matching groups, protected layers, ratio bounds), like an LLM plan.

    Raises:
        ValueError: One line saying what is wrong with the file.
    """
    file = Path(path).expanduser()
    if not file.is_file():
        raise ValueError(f"plan file not found: {path}")
    if file.stat().st_size > MAX_PLAN_BYTES:
        raise ValueError(f"plan file {path} is larger than {MAX_PLAN_BYTES:,} bytes")
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"invalid plan file {path}: not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid plan file {path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    try:
        CompressionPlan.model_validate(unwrap_plan(data))
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(part) for part in err["loc"]) or "plan"
        raise ValueError(f"invalid plan file {path}: {where}: {err['msg']}") from None
    verdict = review_plan(data, read_json(profile_path))
    if not verdict.ok:
        raise ValueError(f"plan file {path} refused: {'; '.join(verdict.reasons)}")
    return verdict.plan.model_dump()
