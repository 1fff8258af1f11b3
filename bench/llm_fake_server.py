"""A fake small LLM behind an OpenAI-compatible server on 127.0.0.1: the smoke path of bench/llm_planners.py."""

from __future__ import annotations

import json
from typing import Any


class FakeSmallModel:
    """An OpenAI-compatible server on 127.0.0.1 that behaves like a small model behind llama-cpp-python.

    It refuses `json_schema` (HTTP 500, llama-cpp-python's message), answers `json_object` + schema with every
    structured group of the schema's enum at the largest ratio up to 0.5 (its own plan), and anything else with
    prose (which the parser refuses). A context manager; `url` is the /v1 base URL.
    """

    def __enter__(self) -> FakeSmallModel:
        import threading
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

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server API
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                status, payload = answer(body)
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
        self.server.shutdown()
        self.server.server_close()
