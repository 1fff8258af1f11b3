"""Models as objects and files: loading (hub, folder, embedded default), input shape, sizes, artifacts.

The rooms after it build on this one: the one definition of parameter count and memory bytes (`sizes`),
PyTorch's dynamic-quantization primitives that artifacts restore (`dynamic_quant`) and the safetensors +
JSON artifacts. It may import `runtimes` (forward calls, ONNX and OpenVINO folders) and the top-level helpers.
"""
