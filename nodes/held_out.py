"""Held-out evaluation agent: the baseline and the delivered model on the held-out test images, once, at the end."""

from __future__ import annotations

from typing import Any

from langgraph.runtime import Runtime

from profiling_agent.nodes.common import (
    absolute,
    allowed_ids,
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
from profiling_agent.state import Best, Context, State
from profiling_agent.tools.evaluation.held_out_eval import baseline_stand_in, delivered_best, held_out_result
from profiling_agent.tools.io import read_json


def evaluate_held_out(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    """Report accuracy on images no plan, probe or selection saw: the baseline's and the best candidate's."""
    from profiling_agent.tools.device import measure_device  # lazy: torch; steps load without it
    from profiling_agent.tools.evaluation.final_latency import final_latency  # lazy: torch; steps load without it

    root = run_dir(state)
    task = "final latency (every contender side by side)"
    emit(runtime, kind="progress", task=task, done=0, total=2, label="")
    images = (lambda: prepared(state)["eval_pixels"]) if state.data else None
    final = final_latency(  # the final verdict: every contender timed again, kept for the report
        state.candidates,
        state.baseline,
        state.baseline_eval,
        context_of(runtime),
        root=root,
        images=images,
        objective=state.objective,
    )
    emit(runtime, kind="progress", task=task, done=2, total=2, label="")
    best, delivery = delivered_best(state.best, state.baseline_eval, state.baseline, state.objective, root, final)
    if final[1].get("not_timed"):  # forms the baseline's measurement says cannot win (result.json says why)
        delivery += f"; not timed again, slower than the peer: {', '.join(sorted(final[1]['not_timed']))}"
    update: dict[str, Any] = {"best": best.model_dump()} if best is not None and best.iteration == 0 else {}
    if state.data is None or state.data.n_test == 0:
        return {
            **update,
            "history": event("evaluate_held_out", f"no held-out test images; {delivery}", state.iteration),
        }
    ctx = context_of(runtime)
    tensors = prepared(state, parts=("test",))  # streamed: the held-out images are read here only
    device = "cpu" if runs_on_cpu_only(best) else measure_device(ctx.device)
    preds = held_out_predictions(state, runtime, best, tensors["test_pixels"], device)
    split = read_json(run_dir(state) / state.data.subsets)["test"]["split"] or "(none: the dataset has no splits)"
    result, message = held_out_result(
        preds,
        tensors["test_labels"],
        best,
        split=split,
        device=device,
        seed=state.dataset.seed,
        procs=ctx.recover_procs,
    )
    return {
        **update,
        "test_eval": result.model_dump(),
        "history": event("evaluate_held_out", f"{message}; {delivery}", state.iteration),
    }


def held_out_predictions(state: State, runtime: Runtime[Context], best: Best | None, pixels: Any, device: str):
    """Predict the held-out images with the baseline and the best model in its delivered form (sharded or not)."""
    from profiling_agent.tools.device import set_threads  # lazy: torch; steps load without it
    from profiling_agent.tools.evaluation.metrics import (
        accuracy_batch,
        concurrent_models,
        predict_many,
    )  # lazy: torch; steps load without it

    ctx = context_of(runtime)
    threads = set_threads(ctx.threads)
    stand_in = baseline_stand_in(state.baseline_eval, run_dir(state), device, threads)
    models = {"baseline": stand_in[0] if stand_in else load_artifact_model(state, state.baseline).model}
    if best and best.artifact:  # in its delivered form: the ONNX Runtime session when ORT was fastest
        models["best"] = load_delivered(state, best, threads=threads)
    emit(runtime, kind="progress", task="held-out test images", done=0, total=len(models), label="")
    if ctx.recover_procs > 1:  # split across processes: the same predictions (docs/distributed.md)
        from profiling_agent.tools.evaluation.records import MeasureSettings  # lazy: torch; steps load without it
        from profiling_agent.tools.evaluation.sharded import run_pass  # lazy: torch; steps load without it

        paths = {"baseline": absolute(state, state.baseline.path)} if state.baseline else {}
        if stand_in:
            paths["baseline"] = stand_in[1]
        ref = delivered_ref(best) if best else None
        if ref is not None:
            paths["best"] = absolute(state, ref.path)
        settings = MeasureSettings.of(ctx, device, max(1, ctx.threads), allowed_ids(state))
        preds = run_pass(run_dir(state), "test", paths, settings, job_dir=run_dir(state) / "test_job")
    else:  # one streamed pass feeds both models (concurrently when cores allow)
        preds = predict_many(
            models,
            pixels,
            batch_size=accuracy_batch(ctx.eval_batch, device),
            device=device,
            allowed_ids=allowed_ids(state),
            parallel=concurrent_models(device, threads, len(models)),
        )
    emit(runtime, kind="progress", task="held-out test images", done=len(models), total=len(models), label="")
    return preds
