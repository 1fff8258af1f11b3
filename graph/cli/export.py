"""The `profiling-agent export` command: a finished run's delivered model as an ONNX or OpenVINO folder."""

from __future__ import annotations

import argparse
from pathlib import Path

from profiling_agent.graph.cli.args import EXIT_OK, BadInput
from profiling_agent.tools.evaluation.export_run import FORMS, ExportError, ExportFormat, export_run


def cmd_export(args: argparse.Namespace) -> int:
    """Export RUN/THREAD's delivered model, check it against torch, print where it is and how accurate it is."""
    from profiling_agent.tools.runtimes.onnx_model import (
        onnxruntime_missing,
    )  # lazy: torch; the CLI's flag check runs without it
    from profiling_agent.tools.runtimes.openvino_model import (
        nncf_missing,
        openvino_missing,
    )  # lazy: torch; the CLI's flag check runs without it

    if args.threads is not None and args.threads < 1:
        raise BadInput("invalid --threads: must be at least 1")
    fmt: ExportFormat = "openvino" if getattr(args, "format", "onnx") == "openvino" else "onnx"
    if (fmt, args.quantize) not in FORMS:
        allowed = ", ".join(q for f, q in FORMS if f == fmt)
        raise BadInput(f"--format {fmt} takes --quantize {allowed}, not {args.quantize}")
    missing = onnxruntime_missing()  # every form starts from the FP32 ONNX export
    if not missing and fmt == "openvino":
        missing = nncf_missing() if args.quantize == "int8" else openvino_missing()
    if missing:
        raise BadInput(missing)
    try:
        done = export_run(Path(args.run_path), fmt=fmt, quantize=args.quantize, out=args.out, threads=args.threads)
    except ExportError as exc:
        raise BadInput(str(exc)) from None
    main_file = "openvino_model.xml" if fmt == "openvino" else "model.onnx"
    diff = done["max_abs_diff"]
    print(
        f"wrote {done['path']}/{main_file} ({done['form']}, {done['size_bytes'] / 1e6:.3f} MB; {done['source']}): "
        f"validation top-1 {done['accuracy']:.2f}% on {done['n_samples']} images (batch {done['eval_batch']}), "
        f"max |logit - torch| {diff if diff is None else f'{diff:.3g}'}, "
        f"top-1 agreement with torch {done['logit_agreement']}%"
    )
    return EXIT_OK
