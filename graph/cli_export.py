"""The `profiling-agent export` command: a finished run's best model as an ONNX folder (the CLI owns the console)."""

from __future__ import annotations

import argparse
from pathlib import Path

from profiling_agent.graph.cli_args import EXIT_OK, BadInput


def cmd_export(args: argparse.Namespace) -> int:
    """Export RUN/THREAD's best model to ONNX, check it against torch, print where it is and how accurate it is."""
    from profiling_agent.tools.evaluation.export_run import ExportError, export_run
    from profiling_agent.tools.models.onnx_model import onnxruntime_missing

    if args.threads is not None and args.threads < 1:
        raise BadInput("invalid --threads: must be at least 1")
    missing = onnxruntime_missing()
    if missing:
        raise BadInput(missing)
    try:
        done = export_run(Path(args.run_path), quantize=args.quantize, out=args.out, threads=args.threads)
    except ExportError as exc:
        raise BadInput(str(exc)) from None
    print(
        f"wrote {done['path']}/model.onnx ({done['method']}, {done['size_bytes'] / 1e6:.3f} MB): validation top-1 "
        f"{done['accuracy']:.2f}% on {done['n_samples']} images, max |logit - torch| {done['max_abs_diff']:.3g}, "
        f"top-1 agreement with torch {done['logit_agreement']:.1f}%"
    )
    return EXIT_OK
