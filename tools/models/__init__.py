"""Models as objects and files: loading (hub, folder, embedded default), input shape, forward calls, sizes, artifacts.

Everything above builds on this room: how to call a classifier on pixels (`forward`), the one definition
of parameter count and memory bytes (`sizes`), PyTorch's dynamic-quantization primitives that artifacts
restore (`dynamic_quant`), the safetensors + JSON artifacts, and ONNX folders run by ONNX Runtime
(`onnx_model`). It imports only the top-level helpers.
"""
