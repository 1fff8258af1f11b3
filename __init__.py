"""profiling-agent: profiling-guided agentic pruning and quantization of vision models."""

__version__ = "0.1.0"
