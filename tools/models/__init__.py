"""Models as objects and files: loading (hub, folder, embedded default), input shape, sizes, artifacts.

Everything above builds on this room: the one definition of parameter count and memory bytes (`sizes`),
PyTorch's dynamic-quantization primitives that artifacts restore (`dynamic_quant`) and the safetensors +
JSON artifacts. It imports only the top-level helpers and `runtimes` (forward calls, ONNX and OpenVINO
folders).
"""
