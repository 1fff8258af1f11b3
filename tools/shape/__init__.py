"""The input-shape LLM of the resolve_shape node: ask a chat model for a model's input shape and verify it.

The deterministic resolution lives in `models.input_shape`; this room adds the language-model fallback
(`llm_shape` settles the shape, `llm_shape_agent` talks to the model). It may import every room below it,
the LLM client of `planning` included, and the prompt templates; nothing in tools imports it.
"""
