"""Changing a model: the structured-pruning engine, family adapters, quantization, uniform baselines, backends.

The engine is split by responsibility: `units` (which channels or heads an entry removes), `depgraph`
(torch-pruning dependency groups and their checks), `pruning` (applying the steps), `self_check`
(numerical checks), `estimate` (what a plan would remove without pruning). Backends: `onnx_runtime` (ONNX
export and ONNX Runtime quantization) and `backends` (the checked ORT variants of a candidate). It may import
`models` and `data`; it never imports profiling, evaluation, planning or reporting.
"""
