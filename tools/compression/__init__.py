"""Changing a model: the structured-pruning engine, family adapters, quantization, uniform baselines.

The engine is split by responsibility: `units` (which channels or heads an entry removes), `depgraph`
(torch-pruning dependency groups and their checks), `pruning` (applying the steps), `self_check`
(numerical checks). ONNX and OpenVINO forms live in `runtimes`. It may import `runtimes`, `models` and
`data`; it never imports profiling, evaluation, planning or reporting.
"""
