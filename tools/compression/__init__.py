"""Changing a model: the structured-pruning engine, family adapters, quantization, uniform baselines.

The engine is split by responsibility: `units` (which channels or heads an entry removes), `depgraph`
(torch-pruning dependency groups and their checks), `pruning` (applying the steps), `self_check`
(numerical checks); `depth` removes whole blocks. ONNX and OpenVINO forms live in the runtimes room. It may
import `runtimes`, `models` and `data` and the top-level helpers. The rooms after it may import it.
"""
