"""Accuracy recovery after pruning: least-squares reconstruction of consumer layers and distillation from the baseline.

`reconstruct` refits the layers that read pruned channels (an MLP's second Linear, the attention output
projection, the next convolution) on calibration activations, without labels or gradients; `distill` fine-tunes
the pruned student against the untouched baseline, resumably (`distill_state` saves and restores its steps),
on images from `tools/data/train_stream`. It may import `runtimes`, `models`, `data` and `compression` and the
top-level helpers. The rooms after it may import it.
"""
