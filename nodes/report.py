"""Report agent: save the best model, write result.json, plots, report.md and report.html, mark the run done."""

from __future__ import annotations

import shutil
from typing import Any

from langgraph.runtime import Runtime

from profiling_agent.nodes.common import (
    absolute,
    context_of,
    delivered_ref,
    emit,
    event,
    load_artifact_model,
    load_delivered,
    prepared,
    run_dir,
    runs_on_cpu_only,
)
from profiling_agent.state import Context, State


def final_latency(state: State, ctx: Context) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Measure the baseline, every finished candidate and the quantization-only form together, interleaved.

    Returns the latencies and the timing facts (wall vs CPU time, busy flag, re-measures).
    """
    from profiling_agent.tools.device import resolve_device
    from profiling_agent.tools.evaluation.delivery import PEER_PREFIX
    from profiling_agent.tools.evaluation.form_eval import eval_threads, load_form
    from profiling_agent.tools.evaluation.latency import measure_latency_checked

    ok = [c for c in state.candidates if c.status == "ok" and c.artifact]
    if not ok or not state.data:
        return {}, {}
    with eval_threads(ctx.threads) as threads:
        models = {"baseline": load_artifact_model(state, state.baseline).model}
        for cand in ok:  # each in its delivered form
            models[f"iter_{cand.iteration:02d}"] = load_delivered(state, cand, threads)
        peer = state.baseline_eval.peer if state.baseline_eval else None
        if peer and peer.get("path") and str(peer.get("name", "")).startswith(("ort_", "ov_")):
            models[PEER_PREFIX + str(peer["name"])] = load_form(absolute(state, str(peer["path"])), threads)
        cpu_only = any(runs_on_cpu_only(c) for c in ok) or len(models) > len(ok) + 1
        device = "cpu" if cpu_only else str(resolve_device(ctx.device))
        pixels = prepared(state)["eval_pixels"][: ctx.latency_batch]
        return measure_latency_checked(
            {k: m.to(device) for k, m in models.items()},
            pixels,
            batch_size=ctx.latency_batch,
            warmup=ctx.latency_warmup,
            repeats=ctx.latency_repeats,
            device=device,
        )


def report(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    """Copy the best candidate to RUN/best and write result.json, plots/, report.md and report.html."""
    from profiling_agent.tools.evaluation.delivery import PEER_PREFIX, delivery_summary, summary_line
    from profiling_agent.tools.io import atomic_dir, read_json, write_json_atomic, write_text_atomic
    from profiling_agent.tools.reporting.files import write_report_files
    from profiling_agent.tools.reporting.markdown import render_markdown
    from profiling_agent.tools.reporting.plot_recovery import attach_curves
    from profiling_agent.tools.reporting.result import build_result

    root = run_dir(state)
    emit(runtime, kind="progress", task="final latency (all models side by side)", done=0, total=2, label="")
    latency, timing = final_latency(state, context_of(runtime))
    emit(runtime, kind="progress", task="final latency (all models side by side)", done=2, total=2, label="")
    delivered = delivered_ref(state.best)
    if delivered is not None:  # the delivered form: an ONNX folder (model.onnx + recipe.json) or the torch artifact
        with atomic_dir(root / "best") as tmp:
            shutil.copytree(absolute(state, delivered.path), tmp, dirs_exist_ok=True)
    final = state.model_dump()
    final["status"] = "done"
    thread = getattr(getattr(runtime, "execution_info", None), "thread_id", None) or root.name  # forks: RUN/T/forks/
    joint = {k: v for k, v in latency.items() if not k.startswith(PEER_PREFIX)}
    if state.best and state.best.iteration == 0 and state.best.eval:  # quantization only: the peer's joint numbers
        key = PEER_PREFIX + state.best.eval.delivered
        if key in latency or "baseline" in latency:
            joint["iter_00"] = latency.get(key) or latency["baseline"]
    result = build_result(final, str(thread), joint)
    result["final_latency_timing"] = timing or None
    result["delivery"] = delivery_summary(result.get("best"), result["baseline"], state.objective, latency, timing)
    result = attach_curves(result, root)  # the report rebuilds from result.json
    write_json_atomic(root / "result.json", result)
    profile_path = root / "profile.json"
    profile = read_json(profile_path) if profile_path.exists() else None
    summary = state.profile.model_dump() if state.profile else None
    try:
        files = write_report_files(root, result, profile, summary)
        trouble = ""
    except Exception as exc:  # noqa: BLE001 - charts and HTML must not fail a finished run: keep report.md
        write_text_atomic(root / "report.md", render_markdown(result, summary))
        files = {"markdown": "report.md", "html": None, "plots": {}}
        trouble = f"; plots and report.html not written ({type(exc).__name__}: {exc})"
    best = result.get("best")
    message = (
        f"best: iteration {best['iteration']}, top-1 {best['accuracy']:.2f}%, {best['params']:,} params"
        if best
        else "no candidate finished"
    ) + trouble
    if result.get("delivery"):
        message += "; " + summary_line(result["delivery"])
    return {
        "status": "done",
        "report": {
            "markdown": files["markdown"],
            "html": files["html"],
            "plots": sorted(files["plots"].values()),
            "result": "result.json",
            "best": "best" if best else None,
        },
        "history": event("report", message, state.iteration),
    }
