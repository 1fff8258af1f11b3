"""Which planner a run uses and the LLM endpoint it talks to, read from the run's settings (no HTTP client here)."""

from __future__ import annotations

import os
from urllib.parse import urlsplit, urlunsplit

from profiling_agent.state import Context, PlannerMode


def llm_base_url(ctx: Context) -> str:
    """Return the configured endpoint: the context's base URL, else $OPENAI_BASE_URL, else ""."""
    return ctx.llm_base_url or os.environ.get("OPENAI_BASE_URL") or ""


def llm_configured(ctx: Context) -> bool:
    """Return True when an OpenAI-compatible endpoint or an API key is configured."""
    return bool(llm_base_url(ctx) or os.environ.get(ctx.llm_api_key_env))


def missing_llm_setting(ctx: Context) -> str:
    """Name what to set so that an LLM is configured (for one-line errors and the console)."""
    key = ctx.llm_api_key_env or "OPENAI_API_KEY"
    return f"set OPENAI_BASE_URL or {key}, or pass --llm-base-url"


def describe_endpoint(ctx: Context) -> str:
    """Describe model and endpoint for humans: credentials in the URL are dropped, the key is never shown."""
    url = llm_base_url(ctx)
    if url:
        parts = urlsplit(url)
        host = parts.hostname or ""
        netloc = f"{host}:{parts.port}" if parts.port else host
        url = urlunsplit((parts.scheme, netloc, parts.path, "", ""))
    return f"{ctx.llm_model} at {url or 'the OpenAI API'}"


def planner_mode(requested: str, ctx: Context) -> PlannerMode:
    """Resolve the objective's planner choice against the configuration.

    Args:
        requested: "llm", "auto", or a planner that never uses the LLM ("deterministic", a uniform baseline).
        ctx: Run context (endpoint, key variable, model).

    Returns:
        The choice resolved: mode "llm", or the planner that runs without an LLM, and a one-line note for the
        console and result.json.

    Raises:
        ValueError: `requested` is "llm" but no LLM is configured (the message names the missing setting).
    """
    if requested not in ("llm", "auto"):
        return PlannerMode(requested=requested, mode=requested, note=f"{requested} planner (requested)")
    if llm_configured(ctx):
        note = f"LLM planner, {describe_endpoint(ctx)} (requested {requested}; deterministic plan if it fails)"
        return PlannerMode(requested=requested, mode="llm", note=note)
    if requested == "llm":
        raise ValueError(f"--planner llm needs an LLM endpoint: {missing_llm_setting(ctx)}")
    note = f"deterministic planner (auto: no LLM configured; {missing_llm_setting(ctx)})"
    return PlannerMode(requested=requested, mode="deterministic", note=note)
