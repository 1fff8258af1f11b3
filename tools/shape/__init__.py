"""The input-shape LLM of the resolve_shape node: ask a chat model for a model's input shape and verify it.

The deterministic resolution lives in `models.input_shape`; this room adds the language-model fallback
(`llm_shape` settles the shape, `llm_shape_agent` talks to the model). It may import every room before it
(`runtimes`, `models`, `data`, `compression`, `recovery`, `profiling`, `evaluation`, `planning`: the LLM
client), the top-level helpers and the prompt templates. Only reporting may import it.
"""
