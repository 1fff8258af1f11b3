"""The evaluate node with backend variants: every form measured, the delivered one reloadable, failures fall back."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers.quick_assets import FAST_LATENCY

pytest.importorskip("onnxruntime")

from profiling_agent.nodes.common import load_delivered, prepared  # noqa: E402
from profiling_agent.nodes.evaluate import evaluate  # noqa: E402
from profiling_agent.state import ArtifactRef, Candidate, Context, DataRef, EvalRecord, QuantEntry, State  # noqa: E402
from profiling_agent.tools.compression.quantization import quantize_model  # noqa: E402
from profiling_agent.tools.evaluation.metrics import predict, top1  # noqa: E402
from profiling_agent.tools.evaluation.selection import choose_form  # noqa: E402
from profiling_agent.tools.io import read_json  # noqa: E402
from profiling_agent.tools.models.artifacts import save_artifact  # noqa: E402
from profiling_agent.tools.runtimes import onnx_forms  # noqa: E402
from profiling_agent.tools.runtimes.forms import SOURCE_CHECK_IMAGES  # noqa: E402
from profiling_agent.tools.runtimes.onnx_model import OrtClassifier  # noqa: E402
from profiling_agent.tools.runtimes.openvino_model import OvClassifier  # noqa: E402

FAST = {**FAST_LATENCY, "latency_batch": 4, "eval_batch": 16}


def _ref(run, saved):
    return ArtifactRef(**{**saved, "path": str(saved["path"]).replace(f"{run}/", "")})


@pytest.fixture
def run_state(tmp_path, one_layer_vit):
    """A run folder with a baseline, a pruned FP32 and a qint8 candidate of a one-layer ViT, and prepared images.

    The images are a save_to_disk dataset of random 16x16 gray images; the run keeps their rows and labels (the
    baseline's predictions, so the baseline is 100% right by construction) and streams the pixels.
    """
    import numpy as np
    from datasets import Dataset, Features, Image, Value
    from PIL import Image as PILImage

    from profiling_agent.tools.data.prepare import preprocess_images, save_tensors
    from profiling_agent.tools.io import write_json_atomic

    run = tmp_path / "run"
    run.mkdir()
    rng = np.random.default_rng(0)
    images = [PILImage.fromarray(rng.integers(0, 256, (16, 16), dtype=np.uint8), mode="L") for _ in range(72)]
    shape = {"channels": 1, "height": 16, "width": 16}
    with torch.inference_mode():
        labels = one_layer_vit(pixel_values=preprocess_images(images, None, shape)).logits.argmax(-1)
    features = Features({"image": Image(), "label": Value("int64")})
    Dataset.from_dict({"image": images, "label": labels.tolist()}, features=features).save_to_disk(tmp_path / "ds")
    rows = {"eval": torch.arange(48), "calib": torch.arange(48, 72)}
    tensors = {f"{p}_{k}": v for p, idx in rows.items() for k, v in (("labels", labels[idx]), ("index", idx))}
    save_tensors(
        run / "data.safetensors", tensors, {"shape": [1, 16, 16], "image_column": "image", "rows": {"eval": 72}}
    )
    roles = {"validation": rows["eval"].tolist(), "test": [], "calibration": rows["calib"].tolist()}
    subsets = {role: {"split": "train", "indices": idx} for role, idx in roles.items()}
    write_json_atomic(run / "subsets.json", {"dataset": str(tmp_path / "ds"), "seed": 0, **subsets})
    base = _ref(run, save_artifact(one_layer_vit, run / "baseline"))
    pruned = _ref(run, save_artifact(one_layer_vit, run / "iter_01" / "pruned"))
    qmodel, quantized = quantize_model(one_layer_vit, [QuantEntry(layer="all", dtype="qint8")])
    cand = _ref(run, save_artifact(qmodel, run / "iter_01" / "candidate", quantized=quantized))
    data = DataRef(
        path="data.safetensors",
        sha256="-",
        n_eval=48,
        n_calib=24,
        image_column="image",
        label_column="label",
        seed=0,
        shape=[1, 16, 16],
    )
    base_eval = EvalRecord(
        name="baseline",
        accuracy=100.0,
        agreement=100.0,
        n_samples=48,
        latency_ms=1.0,
        latency_batch_ms=1.0,
        batch_size=4,
        baseline_latency_ms=1.0,
        speedup=1.0,
        memory_bytes=1,
        size_mb=base.size_bytes / 1e6,
        params=base.params,
        macs=1,
        threads=1,
    )
    current = Candidate(iteration=1, status="ok", pruned=pruned, artifact=cand, quantized=sorted(quantized), macs=1)
    return State(run_path=str(run), baseline=base, data=data, baseline_eval=base_eval, iteration=1, current=current)


def _evaluate(state, backend):
    out = evaluate(state, SimpleNamespace(context=Context(backend=backend, **FAST)))
    return Candidate.model_validate(out["current"])


def test_auto_measures_every_form_and_delivers_the_chosen_one(run_state, monkeypatch):
    from profiling_agent.tools.evaluation import candidate_eval

    timed: list = []  # the per-repeat samples the round chose with (ties with few repeats are judged on them)

    def spy(variants, baseline, objective, eligible=None, samples=None):
        timed.append(samples)
        return choose_form(variants, baseline, objective, eligible, samples)

    monkeypatch.setattr(candidate_eval, "choose_form", spy)
    cand = _evaluate(run_state, "auto")
    ev = cand.eval
    names = [v.name for v in ev.variants]
    assert names == ["torch_qint8", "torch_fp32", *(f"ort_{m}" for m in ("fp32", "dynamic", "static")),
                     *(f"ov_{f}" for f in ("fp32", "bf16", "int8"))]  # fmt: skip
    static = next(v for v in ev.variants if v.name == "ort_static")  # not built for a ViT: the reason says why
    assert static.status == "skipped" and "slower than ort_dynamic" in static.error
    measured = [v for v in ev.variants if v.name not in ("ort_static", "ov_bf16")]
    assert all(v.status == "ok" and v.latency_ms > 0 and v.speedup > 0 for v in measured)
    assert all(v.wall_over_cpu and v.wall_over_cpu > 0 for v in measured)  # CPU time recorded beside wall time
    assert ev.timing and ev.timing["factor"] == 1.5 and "busy" in ev.timing
    choice = choose_form(ev.variants, run_state.baseline_eval, run_state.objective, samples=timed[-1])
    assert choice is not None and ev.delivered == choice.chosen.name
    chosen = next(v for v in ev.variants if v.name == ev.delivered)
    assert (ev.accuracy, ev.latency_ms, ev.speedup) == (chosen.accuracy, chosen.latency_ms, chosen.speedup)
    assert next(v for v in ev.variants if v.name == "ort_fp32").accuracy == 100.0  # the FP32 export is exact
    int8 = next(v for v in ev.variants if v.name == "ov_int8")
    assert int8.recipe["method"] == "nncf_ptq" and int8.recipe["calibration"]["samples"] == 24
    assert int8.recipe["model_type"] == "transformer" and int8.recipe["precision_hint"] == "default"
    assert next(v for v in ev.variants if v.name == "ov_fp32").recipe["precision_hint"] == "f32"
    assert next(v for v in ev.variants if v.name == "ort_dynamic").recipe["eval_batch"] == 16  # recorded
    # the delivered form reloads (an ONNX session, an OpenVINO model or a torch artifact) and reproduces its accuracy
    model = load_delivered(run_state, cand, threads=1)
    assert isinstance(model, OrtClassifier) == ev.delivered.startswith("ort_")
    assert isinstance(model, OvClassifier) == ev.delivered.startswith("ov_")
    data = prepared(run_state)
    acc = top1(predict(model, data["eval_pixels"], batch_size=16), data["eval_labels"])
    assert acc == pytest.approx(ev.accuracy, abs=1e-9)


def test_failed_export_falls_back_to_torch_with_the_reason(run_state, monkeypatch):
    def refuse(*args, **kwargs):
        raise RuntimeError("ONNX export failed: torchscript: unsupported op; dynamo: unsupported op")

    monkeypatch.setattr(onnx_forms, "export_onnx", refuse)
    cand = _evaluate(run_state, "onnxruntime")
    ev = cand.eval
    assert ev.delivered == "torch_qint8" and cand.delivered is None
    assert "no onnxruntime form works" in ev.delivery_note and "unsupported op" in ev.delivery_note
    ort = [v for v in ev.variants if v.backend == "onnxruntime"]
    assert [v.status for v in ort] == ["failed", "failed", "skipped"]
    assert all("unsupported op" in v.error for v in ort[:2])
    auto = _evaluate(run_state, "auto").eval
    assert auto.delivered in ("torch_qint8", "torch_fp32") and "failed: ort_fp32" in auto.delivery_note
    ov = [v for v in auto.variants if v.backend == "openvino" and v.status == "failed"]
    assert ov and all("ONNX export failed" in v.error for v in ov)  # OpenVINO converts the FP32 ONNX file


def test_torch_backend_builds_no_onnx_and_keeps_the_plans_model(run_state):
    cand = _evaluate(run_state, "torch")
    assert [v.name for v in cand.eval.variants] == ["torch_qint8", "torch_fp32"]
    assert cand.eval.delivered == "torch_qint8" and cand.delivered is None
    assert cand.eval.quant_speedup is not None
    assert not list(Path(run_state.run_path).rglob("*.onnx"))


def _finished_run(run_state):
    """Write the result.json of a finished run whose best is iteration 1 (its FP32 pruned model on disk)."""
    from profiling_agent.tools.io import write_json_atomic

    run = Path(run_state.run_path)
    best = {"iteration": 1, "pruned_path": "iter_01/pruned", "params": 1, "macs": 1, "variants": []}
    write_json_atomic(run / "result.json", {"best": best, "baseline": {"path": "baseline"}, "labels": {}})
    return run


def test_export_openvino_int8_runs_with_openvino_and_leaves_no_scratch(run_state):
    pytest.importorskip("nncf")
    import numpy as np
    import openvino as ov

    from profiling_agent.tools.evaluation.export_run import ExportError, export_run

    run = _finished_run(run_state)
    target = run / "export" / "openvino-int8"
    for stale in (".openvino-int8.building", ".openvino-int8.abc123"):  # what killed exports leave behind
        (target.parent / stale / "ov_int8").mkdir(parents=True)
    done = export_run(run, fmt="openvino", quantize="int8", threads=1)
    assert done["form"] == "ov_int8" and done["eval_batch"] == 64 and done["source"].startswith("built from")
    assert sorted(p.name for p in target.parent.iterdir()) == ["openvino-int8"]  # scratch and leftovers swept
    core = ov.Core()
    compiled = core.compile_model(core.read_model(str(target / "openvino_model.xml")), "CPU")
    data = prepared(run_state)
    pixels = data["eval_pixels"][:48]
    logits = compiled(pixels.numpy())[0]
    acc = 100.0 * float((np.argmax(logits, 1) == data["eval_labels"][:48].numpy()).mean())
    assert acc == pytest.approx(done["accuracy"], abs=100.0 / 48 + 1e-9)  # OpenVINO alone, the printed accuracy
    with pytest.raises(ExportError, match="takes --quantize none, int8"):
        export_run(run, fmt="openvino", quantize="dynamic")


def test_export_copies_the_form_the_run_built(run_state):
    from profiling_agent.tools.evaluation.export_run import export_run
    from profiling_agent.tools.io import read_json, write_json_atomic

    cand = _evaluate(run_state, "onnxruntime")
    run = _finished_run(run_state)
    result = read_json(run / "result.json")
    result["best"]["variants"] = [v.model_dump() for v in cand.eval.variants]
    write_json_atomic(run / "result.json", result)
    done = export_run(run, fmt="onnx", quantize="dynamic", threads=1)
    recorded = next(v for v in cand.eval.variants if v.name == "ort_dynamic")
    assert done["source"].startswith("the form the run built") and recorded.path in done["source"]
    assert done["accuracy"] == pytest.approx(recorded.accuracy, abs=1e-9)  # the same file, the same batch


def test_openvino_baseline_builds_ort_fp32_as_source_only(run_state, monkeypatch):
    """--backend openvino cannot deliver ort_fp32: measure_baseline builds it for the IR, never times or scores it."""
    pytest.importorskip("openvino")
    from profiling_agent.nodes.measure_baseline import measure_baseline
    from profiling_agent.tools.evaluation import latency

    timed: list[str] = []
    real = latency.measure_latency

    def spy(models, sample, **kwargs):
        timed.extend(models)
        return real(models, sample, **kwargs)

    monkeypatch.setattr(latency, "measure_latency", spy)
    state = run_state.model_copy(update={"baseline_eval": None})
    out = measure_baseline(state, SimpleNamespace(context=Context(backend="openvino", **FAST)))
    record = EvalRecord.model_validate(out["baseline_eval"])
    rows = {v.name: v for v in record.variants}
    source = rows["ort_fp32"]
    assert source.status == "unscored" and source.latency_ms is None and source.accuracy is None
    assert "--backend openvino cannot deliver it" in str(source.error)
    assert source.path and (Path(run_state.run_path) / source.path).is_dir()  # built: the IR is converted from it
    assert "ort_fp32" not in timed and "ov_fp32" in timed and "baseline" in timed
    assert "ort_fp32 not timed or scored (built as a source only)" in out["history"][0]["message"]
    recipes = {n: read_json(Path(run_state.run_path) / rows[n].path / "recipe.json") for n in ("ort_fp32", "ov_fp32")}
    assert recipes["ort_fp32"]["check"]["images"] == SOURCE_CHECK_IMAGES  # a source is checked on two images only
    assert recipes["ov_fp32"]["check"]["images"] > SOURCE_CHECK_IMAGES  # the form converted from it on all of them
    ov = {n: v for n, v in rows.items() if n.startswith("ov_") and v.status != "failed"}
    assert all(v.latency_ms for v in ov.values() if v.status != "skipped")  # every form built is timed
    assert all("bf16" in str(v.error) for v in ov.values() if v.status == "skipped")  # only bf16, on a CPU without it
