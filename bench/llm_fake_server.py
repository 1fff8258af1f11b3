"""A fake small LLM behind an OpenAI-compatible server on 127.0.0.1: the smoke path of bench/llm_planners.py.

It streams (server-sent events) when a request asks for `stream: true`, as every OpenAI-compatible server does,
at a pace of its settings: `first_delay` (the prompt read before the first token), `interval` between chunks (a
slow but steady CPU server), `stall_after` chunks then silence (a server that stops producing tokens).
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any


def stream_chunks(payload: dict[str, Any], pieces: int = 8, include_usage: bool = True) -> list[dict[str, Any]]:
    """Split a chat.completion body into the chat.completion.chunk events a server streams for it.

    The role first (no text, as servers open a stream), the text in `pieces` parts, each tool call as its name
    and its arguments in two parts, the finish reason, then the usage alone (when the request asked for it).
    """
    choice, base = (
        payload["choices"][0],
        {
            "id": payload.get("id", "fake"),
            "object": "chat.completion.chunk",
            "created": payload.get("created", 0),
            "model": payload.get("model", "fake-small"),
        },
    )

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    message = choice["message"]
    out = [chunk({"role": "assistant", "content": ""})]
    text = message.get("content") or ""
    step = max(1, -(-len(text) // pieces))
    out += [chunk({"content": text[i : i + step]}) for i in range(0, len(text), step)]
    for n, call in enumerate(message.get("tool_calls") or []):
        fn = call["function"]
        head = {"index": n, "id": call["id"], "type": "function", "function": {"name": fn["name"], "arguments": ""}}
        out.append(chunk({"tool_calls": [head]}))
        args = fn["arguments"]
        for part in (args[: len(args) // 2], args[len(args) // 2 :]):
            if part:
                out.append(chunk({"tool_calls": [{"index": n, "function": {"arguments": part}}]}))
    out.append(chunk({}, choice.get("finish_reason") or "stop"))
    if include_usage and payload.get("usage"):
        out.append({**base, "choices": [], "usage": payload["usage"]})
    return out


def write_stream(
    handler: Any,
    events: list[dict[str, Any]],
    *,
    first_delay: float = 0.0,
    interval: float = 0.0,
    stall_after: int | None = None,
    release: threading.Event | None = None,
) -> None:
    """Send `events` to an http.server handler as server-sent events, then `data: [DONE]`.

    The headers go at once (as llama-cpp-python's server sends them); the first event after `first_delay` s,
    the next ones `interval` s apart. With `stall_after` the stream stops after that many events and the
    handler waits on `release` (set when the server closes) without sending anything more.
    """
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream")
    handler.send_header("Cache-Control", "no-cache")
    handler.end_headers()
    handler.wfile.flush()
    try:
        time.sleep(first_delay)
        for n, event in enumerate(events):
            if stall_after is not None and n >= stall_after:
                (release or threading.Event()).wait(600)
                return
            handler.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
            handler.wfile.flush()
            time.sleep(interval)
        handler.wfile.write(b"data: [DONE]\n\n")
        handler.wfile.flush()
    except OSError:  # the client cut the reply
        pass


class FakeSmallModel:
    """An OpenAI-compatible server on 127.0.0.1 that behaves like a small model behind llama-cpp-python.

    It refuses `json_schema` (HTTP 500, llama-cpp-python's message), answers `json_object` + schema with every
    structured group of the schema's enum at the largest ratio up to 0.5 (its own plan), and anything else with
    prose (which the parser refuses). A context manager; `url` is the /v1 base URL. A streamed reply keeps the
    pace of `first_delay`, `interval` and `stall_after` (`write_stream`).
    """

    def __init__(self, first_delay: float = 0.0, interval: float = 0.0, stall_after: int | None = None):
        self.pace = {"first_delay": first_delay, "interval": interval, "stall_after": stall_after}
        self.release = threading.Event()
        self.requests = 0  # requests received
        self.streamed = 0  # replies streamed (a refused response_format is answered whole)

    def __enter__(self) -> FakeSmallModel:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        def answer(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
            fmt = body.get("response_format") or {}
            if fmt.get("type") == "json_schema":
                return 500, {"error": {"message": "response_format.type: Input should be 'text' or 'json_object'"}}
            content = "I would prune the MLP layers by about half."
            schema = fmt.get("schema") or {}
            items = ((schema.get("properties") or {}).get("pruning") or {}).get("items") or {}
            for entry in items.get("anyOf") or [items]:
                props = entry.get("properties") or {}
                if (props.get("type") or {}).get("enum") == ["structured"]:
                    ratio = max(r for r in props["ratio"]["enum"] if r <= 0.5)
                    groups = props["groups"]["items"]["enum"]
                    prune = [{"type": "structured", "groups": groups, "ratio": ratio, "justification": "cheap"}]
                    content = json.dumps({"pruning": prune, "quantization": [], "rationale": "every MLP"})
            usage = {"prompt_tokens": 900, "completion_tokens": 60, "total_tokens": 960}
            message = {"role": "assistant", "content": content}
            choice = {"index": 0, "message": message, "finish_reason": "stop"}
            return 200, {
                "id": "fake",
                "object": "chat.completion",
                "created": 0,
                "model": "fake-small",
                "choices": [choice],
                "usage": usage,
            }

        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server API
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                owner.requests += 1
                status, payload = answer(body)
                if status == 200 and body.get("stream"):
                    usage = bool((body.get("stream_options") or {}).get("include_usage"))
                    events = stream_chunks(payload, pieces=12, include_usage=usage)
                    owner.streamed += 1
                    write_stream(self, events, release=owner.release, **owner.pace)
                    return
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
