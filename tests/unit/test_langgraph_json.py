"""langgraph.json: the LangGraph template's `$schema`, accepted by langgraph-cli's config validation."""

from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCHEMA_URL = "https://langgra.ph/schema.json"  # as langchain-ai/new-langgraph-project's langgraph.json has it


def test_langgraph_json_names_the_schema_and_validates():
    from langgraph_cli.config import validate_config_file

    raw = json.loads((REPO / "langgraph.json").read_text())
    assert next(iter(raw)) == "$schema" and raw["$schema"] == SCHEMA_URL
    config = validate_config_file(REPO / "langgraph.json")
    assert config["dependencies"] == ["."]
    path, _, name = config["graphs"]["profiling_agent"].partition(":")
    assert name == "graph" and (REPO / path).is_file()
