"""Prompts of the Input Shape Resolver Agent: architecture metadata in, channels/height/width JSON out."""

from __future__ import annotations

import json
from typing import Any

from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage

# No placeholders.
INPUT_SHAPE_SYSTEM = """You are the Input Shape Resolver Agent of ProfilingAgent. From an image classifier's \
metadata (model config and image processor settings) you infer the shape of one input image tensor. Prefer, in \
order: the processor's crop_size, then its size (shortest_edge means a square of that side), then the config's \
image_size; channels come from the config's num_channels (3 for RGB when absent). Your answer is verified by a \
real forward pass.
Reply with exactly one JSON object and nothing else:
{"channels": <int 1-16>, "height": <int 1-4096>, "width": <int 1-4096>, "reason": "<one sentence>"}"""

# Placeholders: {metadata} (JSON of the config and processor fields, truncated to MAX_METADATA_CHARS).
INPUT_SHAPE_USER = """Metadata of the model:
{metadata}

Which input shape does it expect? Answer with the JSON object only."""

MAX_METADATA_CHARS = 4000


def render_input_shape(metadata: dict[str, Any]) -> list[BaseMessage]:
    """Build the resolver's messages from the metadata (serialized compactly, long values cut)."""
    text = json.dumps(metadata, default=str, sort_keys=True)
    if len(text) > MAX_METADATA_CHARS:
        text = text[:MAX_METADATA_CHARS] + " ...(truncated)"
    return [SystemMessage(content=INPUT_SHAPE_SYSTEM), HumanMessage(content=INPUT_SHAPE_USER.format(metadata=text))]
