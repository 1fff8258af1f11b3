"""Running a model and exporting it to run elsewhere: torch forward calls, ONNX Runtime and OpenVINO.

`forward` (how to call a classifier on pixels and time it), `onnx_model` and `openvino_model` (exported
folders run like torch models, opened through `form_folder`, the one folder loader), `onnx_runtime` (ONNX export
and ONNX Runtime quantization), `onnx_forms` (the checked ORT forms of a candidate), `openvino_forms` (the
OpenVINO forms) and `forms` (every deployable form built, checked and chosen between; `load_form` opens a
folder of either kind), `telemetry` (OpenVINO's and NNCF's usage telemetry off for the process). It is the
lowest room: it may import only the top-level helpers. Every other room may import it.
"""

from profiling_agent.tools.runtimes.telemetry import disable_telemetry

disable_telemetry()  # before any module of this room imports openvino or nncf (tools.runtimes.telemetry)
