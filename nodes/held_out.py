"""Test agent: measure the baseline and the delivered model on the held-out test images, once, after selection."""

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
from profiling_agent.state import Best, Context, State, TestEval


def test_best(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    """Report accuracy on images no plan, probe or selection saw: the baseline's and the best candidate's."""
    from profiling_agent.tools.device import resolve_device, set_threads
    from profiling_agent.tools.evaluation.bootstrap import correct, paired_delta_ci
    from profiling_agent.tools.evaluation.delivery import choose_delivery
    from profiling_agent.tools.evaluation.metrics import (
        accuracy_batch,
        agreement,
        concurrent_models,
        predict_many,
        top1,
    )
    from profiling_agent.tools.io import read_json, sha256_path

    # what best/ holds: the pruned best when it keeps the budget and pruning bought something, else the
    # unpruned model's fastest form within the budget (quantization only)
    base = state.baseline_eval.model_dump() if state.baseline_eval else None
    ref = state.baseline.model_dump() if state.baseline else None
    picked, why = choose_delivery(state.best.model_dump() if state.best else None, base, ref, state.objective)
    if picked and picked.get("delivered") and not picked["delivered"].get("sha256"):  # the peer's form on disk
        picked["delivered"]["sha256"] = sha256_path(run_dir(state) / picked["delivered"]["path"])
    best = Best.model_validate(picked) if picked else None
    update: dict[str, Any] = {"best": best.model_dump()} if best is not None and best.iteration == 0 else {}
    delivery = f"delivered: {'iteration ' + str(best.iteration) if best and best.iteration else 'the unpruned model'}"
    delivery += f" ({why})" if best else ""
    data = state.data
    if data is None or data.n_test == 0:
        return {**update, "history": event("test_best", f"no held-out test images; {delivery}", state.iteration)}
    ctx = context_of(runtime)
    tensors = prepared(state, parts=("test",))  # streamed: the held-out images are read here only
    pixels, labels = tensors["test_pixels"], tensors["test_labels"]
    models = {"baseline": load_artifact_model(state, state.baseline).model}
    if best and best.artifact:  # in its delivered form: the ONNX Runtime session when ORT was fastest
        models["best"] = load_delivered(state, best, threads=set_threads(ctx.threads))
    device = "cpu" if runs_on_cpu_only(best) else str(resolve_device(ctx.device))
    emit(runtime, kind="progress", task="held-out test images", done=0, total=len(models), label="")
    if ctx.recover_procs > 1:  # split across processes: the same predictions (docs/distributed.md)
        from profiling_agent.tools.evaluation.sharded import sharded_predictions

        paths = {"baseline": absolute(state, state.baseline.path)} if state.baseline else {}
        ref = delivered_ref(best) if best else None
        if ref is not None:
            paths["best"] = absolute(state, ref.path)
        preds = sharded_predictions(
            run_dir(state), "test", paths, procs=ctx.recover_procs, job_dir=run_dir(state) / "test_job",
            batch_size=accuracy_batch(ctx.eval_batch, device), launcher=ctx.launcher, device=device,
            threads=max(1, ctx.threads), allowed_ids=allowed_ids(state),
        )  # fmt: skip
    else:
        preds = predict_many(  # one streamed pass feeds both models (concurrently when cores allow)
            models,
            pixels,
            batch_size=accuracy_batch(ctx.eval_batch, device),
            device=device,
            allowed_ids=allowed_ids(state),
            parallel=concurrent_models(device, set_threads(ctx.threads), len(models)),
        )
    emit(runtime, kind="progress", task="held-out test images", done=len(models), total=len(models), label="")
    subsets = read_json(run_dir(state) / data.subsets)
    result = TestEval(
        split=subsets["test"]["split"] or "(none: the dataset has no splits)",
        n_samples=len(labels),
        device=device,
        baseline_accuracy=top1(preds["baseline"], labels),
    )
    message = f"held-out test ({result.n_samples} images): baseline {result.baseline_accuracy:.2f}%"
    if ctx.recover_procs > 1:
        message = message.replace(" images)", f" images, {ctx.recover_procs} processes)", 1)
    if "best" in preds and best:
        result.best_iteration = best.iteration
        result.best_accuracy = top1(preds["best"], labels)
        result.agreement = agreement(preds["best"], preds["baseline"])
        result.delta = round(result.best_accuracy - result.baseline_accuracy, 6)
        ci = paired_delta_ci(
            correct(preds["best"], labels), correct(preds["baseline"], labels), seed=state.dataset.seed
        )
        result.delta_ci = list(ci)
        message += (
            f", best (iteration {best.iteration}) {result.best_accuracy:.2f}% "
            f"({result.delta:+.2f} pp, 95% CI [{ci[0]:+.2f}, {ci[1]:+.2f}])"
        )
    return {
        **update,
        "test_eval": result.model_dump(),
        "history": event("test_best", f"{message}; {delivery}", state.iteration),
    }
