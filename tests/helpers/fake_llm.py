"""Test doubles for the LLM: a scripted chat model with bind_tools, and a local OpenAI-compatible HTTP server."""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.utils.function_calling import convert_to_openai_tool
from llm_fake_server import stream_chunks, write_stream
from pydantic import Field

from profiling_agent.state import GroupSensitivity, PlannerProfile

_ids = itertools.count(1)

# ---------------------------------------------------------------- scripted chat model


def tool_call(name: str, args: dict[str, Any] | None = None, call_id: str | None = None) -> dict[str, Any]:
    """Build one LangChain tool call."""
    return {"name": name, "args": args or {}, "id": call_id or f"call_{next(_ids)}", "type": "tool_call"}


def ai_tool_calls(*calls: dict[str, Any], content: str = "") -> AIMessage:
    """Build an AIMessage that requests the given tool calls."""
    return AIMessage(content=content, tool_calls=list(calls))


class ScriptedChatModel(BaseChatModel):
    """Chat model that replies from a script, one item per call.

    Items: an AIMessage, a str (becomes AIMessage content), an exception (raised), or a callable taking the
    messages and returning one of those. When the script runs out, the last item repeats if `repeat_last`, else
    the call raises IndexError. Every call's messages and bound kwargs are recorded.
    """

    script: list[Any] = Field(default_factory=list)
    repeat_last: bool = False
    calls: list[list[BaseMessage]] = Field(default_factory=list)
    call_kwargs: list[dict[str, Any]] = Field(default_factory=list)
    bound_tools: list[str] = Field(default_factory=list)
    position: int = 0

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def _next_item(self) -> Any:
        if self.position < len(self.script):
            item = self.script[self.position]
            self.position += 1
            return item
        if self.repeat_last and self.script:
            return self.script[-1]
        raise IndexError(f"script exhausted after {self.position} replies")

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        self.calls.append(list(messages))
        self.call_kwargs.append(dict(kwargs))
        item = self._next_item()
        if callable(item) and not isinstance(item, BaseMessage):
            item = item(messages)
        if isinstance(item, BaseException):
            raise item
        message = AIMessage(content=item) if isinstance(item, str) else item
        return ChatResult(generations=[ChatGeneration(message=message)])

    def bind_tools(self, tools: Sequence[Any], *, tool_choice: str | None = None, **kwargs: Any) -> Any:
        """Record the tool names and bind their OpenAI schemas like a real chat model does."""
        formatted = [convert_to_openai_tool(t) for t in tools]
        self.bound_tools = [f["function"]["name"] for f in formatted]
        if tool_choice is not None:
            kwargs["tool_choice"] = tool_choice
        return self.bind(tools=formatted, **kwargs)


def sleeper(seconds: float, release: threading.Event, reply: str = "{}") -> Callable[[list[BaseMessage]], str]:
    """Script item that blocks up to `seconds` (until `release` is set), then replies."""

    def item(messages: list[BaseMessage]) -> str:
        release.wait(seconds)
        return reply

    return item


# ---------------------------------------------------------------- OpenAI-compatible server


def chat_completion(
    content: str | None = None, tool_calls: list[dict[str, Any]] | None = None, model: str = "fake-model"
) -> dict[str, Any]:
    """Build an OpenAI chat.completion body; tool_calls items are {"name", "args", "id"}."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = [
            {
                "id": c.get("id") or f"call_{next(_ids)}",
                "type": "function",
                "function": {"name": c["name"], "arguments": json.dumps(c.get("args", {}))},
            }
            for c in tool_calls
        ]
    return {
        "id": f"chatcmpl-{next(_ids)}",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if tool_calls else "stop"}],
        "usage": {"prompt_tokens": 120, "completion_tokens": 30, "total_tokens": 150},
    }


class ScriptedOpenAIServer:
    """OpenAI-compatible chat-completions server on 127.0.0.1 answering from a script (use as a context manager).

    Script items: a dict (200 JSON body), a (status, body) tuple, ("sleep", seconds, item) to delay the
    answer, or a callable taking the request body and returning one of those
    (a server that looks at the request, e.g. at its `response_format`). A 200 answer to a request with
    `stream: true` is streamed as server-sent events (a body that is no chat completion is sent as it is). Past
    the end of the script it answers 500. Request bodies are recorded in `requests`. The server stops on exit,
    and by itself after `lifetime` seconds.
    """

    def __init__(self, script: list[Any], lifetime: float = 60.0):
        self.script, self.lifetime = list(script), lifetime
        self.requests: list[dict[str, Any]] = []
        self.slept_out = 0  # requests whose scripted sleep ran to its end (the client was still waiting, or gone)
        self.release = threading.Event()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._timer: threading.Timer | None = None

    @property
    def base_url(self) -> str:
        """Return the /v1 base URL to give ChatOpenAI."""
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def _next(self) -> Any:
        with self._lock:
            return self.script.pop(0) if self.script else (500, {"error": {"message": "script exhausted"}})

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server API
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                with owner._lock:
                    owner.requests.append({"path": self.path, "body": json.loads(body or b"{}")})
                item = owner._next()
                if callable(item):
                    item = item(owner.requests[-1]["body"])
                while isinstance(item, tuple) and item and item[0] == "sleep":
                    if not owner.release.wait(item[1]):
                        with owner._lock:
                            owner.slept_out += 1
                    item = item[2]
                status, payload = item if isinstance(item, tuple) else (200, item)
                body = owner.requests[-1]["body"]
                if status == 200 and body.get("stream") and "choices" in payload:  # garbage goes as it is
                    usage = bool((body.get("stream_options") or {}).get("include_usage"))
                    write_stream(self, stream_chunks(payload, include_usage=usage), release=owner.release)
                    return
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the client gave up (timeout)
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        return Handler

    def __enter__(self) -> ScriptedOpenAIServer:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self._timer = threading.Timer(self.lifetime, self.close)
        self._timer.daemon = True
        self._timer.start()
        return self

    def close(self) -> None:
        """Stop serving and release sleeping handlers."""
        self.release.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._timer is not None:
            self._timer.cancel()

    def __exit__(self, *exc: Any) -> None:
        self.close()


# ---------------------------------------------------------------- sample planner inputs


def _row(name: str, kind: str, params: int, macs: int) -> dict[str, Any]:
    return {"name": name, "type": kind, "params": params, "macs": macs, "latency_ms": 0.0, "leaf": True}


def vit_profile(
    n_layers: int = 2, hidden: int = 32, inter: int = 64, heads: int = 4, tokens: int = 17, labels: int = 10
) -> dict[str, Any]:
    """Build a profile.json-shaped dict of a ViT (transformers 5 module names) by hand, with costs and shares.

    Latency is proportional to MACs (1 ms per GMAC), so shares are consistent across metrics.
    """
    h, i, t = hidden, inter, tokens
    rows = [
        _row("vit.embeddings.patch_embeddings.projection", "Conv2d", 16 * h + h, (t - 1) * 16 * h),
        _row("vit.embeddings", "ViTEmbeddings", h + t * h, 0),
    ]
    groups = []
    protected = ["vit.embeddings", "vit.layernorm", "classifier"]
    for n in range(n_layers):
        block = f"vit.layers.{n}"
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            rows.append(_row(f"{block}.attention.{proj}", "Linear", h * h + h, t * (h * h + h)))
        rows.append(_row(f"{block}.attention", "ViTAttention", 0, 2 * t * t * h))
        rows += [
            _row(f"{block}.layernorm_before", "LayerNorm", 2 * h, 2 * t * h),
            _row(f"{block}.layernorm_after", "LayerNorm", 2 * h, 2 * t * h),
            _row(f"{block}.mlp.fc1", "Linear", h * i + i, t * (h * i + i)),
            _row(f"{block}.mlp.activation_fn", "GELUActivation", 0, t * i),
            _row(f"{block}.mlp.fc2", "Linear", i * h + h, t * (i * h + h)),
        ]
        protected += [f"{block}.layernorm_before", f"{block}.layernorm_after"]
        attn = f"{block}.attention"
        groups.append(
            {
                "name": f"layers.{n}.heads",
                "kind": "head",
                "module": attn,
                "roots": [f"{attn}.q_proj", f"{attn}.k_proj", f"{attn}.v_proj"],
                "members": [f"{attn}.q_proj", f"{attn}.k_proj", f"{attn}.v_proj", f"{attn}.o_proj"],
                "units": heads,
                "unit_size": h // heads,
                "min_units": 1,
                "block": block,
            }
        )
        groups.append(
            {
                "name": f"layers.{n}.mlp",
                "kind": "structured",
                "module": f"{block}.mlp.fc1",
                "roots": [f"{block}.mlp.fc1"],
                "members": [f"{block}.mlp.fc1", f"{block}.mlp.fc2"],
                "units": i,
                "unit_size": 1,
                "min_units": 1,
                "block": block,
            }
        )
    rows.append(_row("vit.layernorm", "LayerNorm", 2 * h, 2 * t * h))
    rows.append(_row("classifier", "Linear", h * labels + labels, h * labels + labels))
    total_params = sum(r["params"] for r in rows)
    total_macs = sum(r["macs"] for r in rows)
    timed = total_macs / 1e9
    for r in rows:
        r["latency_ms"] = r["macs"] / 1e9
        r["macs_share"] = r["macs"] / total_macs
        r["latency_share"] = r["latency_ms"] / timed
    costs = {}
    for g in groups:
        members = [r for r in rows if any(r["name"] == m or r["name"].startswith(m + ".") for m in g["members"])]
        params, macs = sum(r["params"] for r in members), sum(r["macs"] for r in members)
        costs[g["name"]] = {
            "kind": g["kind"],
            "block": g["block"],
            "params": params,
            "macs": macs,
            "latency_ms": macs / 1e9,
            "params_share": params / total_params,
            "macs_share": macs / total_macs,
            "latency_share": macs / total_macs,
            "missing": [],
        }
    totals = {
        "params": total_params,
        "macs": total_macs,
        "latency_ms": timed * 1.1,
        "timed_ms": timed,
        "act_bytes": 0,
        "output_bytes": 0,
    }
    return {
        "totals": totals,
        "layers": rows,
        "groups": groups,
        "group_costs": costs,
        "protected": protected,
        "operators": [],
        "env": {"device": "cpu", "threads": 1, "input_shape": [1, 16, 16], "batch": 1},
    }


def vit_sensitivity(profile: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Probe results shaped like tools/profiling/sensitivity.py's: MLPs cheap to prune, heads and late layers costly."""
    out = {}
    for n, g in enumerate(profile["groups"]):
        damage = (0.02 if g["kind"] == "structured" else 0.3) * (1 + n)
        out[g["name"]] = {
            "damage": damage,
            "kl": damage * 0.8,
            "agreement": 100 - 20 * damage,
            "acc_drop": 10 * damage,
            "ratio": 0.3,
            "units_removed": 1,
        }
    return out


# The reply a real local model (llama-cpp-python server) gave in round 2: regexes with `\.`, which is no JSON
# escape. It used to fail to parse whole, and the quantization entry inside it was taken for "the plan".
REAL_REPLY = r"""```json
{
  "pruning": [
    { "layer": "^vit\.layers\.(0|1|2|3)\.attention$", "type": "head", "ratio": 0.4, "justification": "low damage" },
    { "layer": "^vit\.layers\.(0|1|2|3)\.mlp\.fc1$", "type": "structured", "ratio": 0.5, "justification": "big" }
  ],
  "quantization": [
    { "layer": "all", "type": "dynamic", "dtype": "qint8", "justification": "Linear-heavy" }
  ],
  "rationale": "prune the cheap-to-lose blocks"
}
```"""
# Round 1's variant: "structured" on the attention blocks (the guard names the right type; see test_plan_guard).
FIRST_ROUND_REPLY = REAL_REPLY.replace('"type": "head"', '"type": "structured"')


def local_llm_only(monkeypatch) -> None:
    """Make the test's LLM calls reach only the local fake server: no endpoint or key from the environment, no proxy."""
    for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "OPENAI_MODEL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")


def quick_request_retry(monkeypatch, seconds: float = 0.05) -> None:
    """Rebuild the conversation subgraph with the same request retry policy but `seconds` before the second try.

    The policy's attempts and what it retries on stay as they are; only the test's wait before a retry is shorter.
    """
    from profiling_agent.tools.planning import llm_conversation

    quick = llm_conversation.REQUEST_RETRY._replace(initial_interval=seconds, jitter=False)
    monkeypatch.setattr(llm_conversation, "REQUEST_RETRY", quick)
    monkeypatch.setattr(llm_conversation, "conversation", llm_conversation.build_conversation())


def kinds_of(groups: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    """Return profile groups (JSON) as the (name, kind) pairs the plan schema reads."""
    return [(str(g["name"]), str(g["kind"])) for g in groups]


def guard_profile(
    groups: Sequence[dict[str, Any]],
    protected: Sequence[str] = (),
    costs: dict[str, Any] | None = None,
    layers: list[dict[str, Any]] | None = None,
) -> PlannerProfile:
    """Return the typed profile the plan guard reads, from profile.json pieces (no layer rows: None)."""
    data: dict[str, Any] = {"groups": list(groups), "protected": list(protected), "group_costs": costs or {}}
    if layers is not None:
        data["layers"] = layers
    return PlannerProfile.of(data)


def probe_records(sensitivity: dict[str, dict[str, Any]]) -> dict[str, GroupSensitivity]:
    """Return probe results (JSON, as `vit_sensitivity` builds them) as the typed records the tools read."""
    return {name: GroupSensitivity.model_validate(record) for name, record in sensitivity.items()}
