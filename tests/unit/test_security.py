"""Security properties of the package source: no code execution of text, safe loading, guarded plan regexes."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SKIP_DIRS = {"tests", "build", "runs", "__pycache__"}
RE_CALLS = {"compile", "search", "match", "fullmatch", "sub", "subn", "split", "findall", "finditer"}
# Every place a regex that is not a literal is compiled or searched, and why its pattern is safe.
# A new site must check its pattern with tools.plan_guard.regex_problem (or check_plan) and be listed here.
DYNAMIC_REGEX_SITES = {
    ("prompts/analysis.py", "regex_families"): "built from re.escape'd module names of the model",
    ("tools/planning/llm_tools.py", "_match_layers"): "regex_problem() is checked first",
    ("tools/planning/llm_tools.py", "_estimate_plan"): "only the layers of a plan check_plan accepted",
    ("tools/planning/regex_safety.py", "regex_problem"): "the guard: length-limited, parsed, then compiled",
    ("tools/planning/plan_guard.py", "compile_all"): (
        "patterns that passed regex_problem and the timed child-process search"
    ),
    ("tools/compression/units.py", "_parse_entry"): (
        "plans are re.escape'd (deterministic) or passed check_plan (LLM, human)"
    ),
    ("tools/compression/quantization.py", "_compile"): (
        "plans are 'all' (deterministic) or passed check_plan (LLM, human)"
    ),
}


def package_sources() -> dict[str, ast.Module]:
    """Parse every Python file of the package (the repository minus tests and the virtualenv)."""
    out = {}
    for path in sorted(REPO.rglob("*.py")):
        rel = path.relative_to(REPO)
        if any(part.startswith(".") or part in SKIP_DIRS for part in rel.parts):
            continue
        out[rel.as_posix()] = ast.parse(path.read_text(encoding="utf-8"), filename=str(rel))
    return out


SOURCES = package_sources()


def _calls(tree: ast.AST):
    """Yield (call, enclosing function name) for every call in `tree`."""

    def walk(node: ast.AST, func: str):
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else func
            if isinstance(child, ast.Call):
                yield child, name
            yield from walk(child, name)

    yield from walk(tree, "<module>")


def _dotted(node: ast.AST) -> str:
    """Return "a.b.c" for a Name/Attribute chain, "" otherwise."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


def code_execution(sources: dict[str, ast.Module]) -> list[str]:
    """Calls that execute or compile text as code."""
    banned = {"eval", "exec", "compile", "builtins.eval", "builtins.exec", "os.system", "os.popen"}
    return [
        f"{name}:{call.lineno} {_dotted(call.func)}"
        for name, tree in sources.items()
        for call, _ in _calls(tree)
        if _dotted(call.func) in banned
    ]


def unsafe_loading(sources: dict[str, ast.Module]) -> list[str]:
    """Pickle-family imports, torch.load without weights_only=True, yaml.load."""
    banned_modules = {"pickle", "cPickle", "dill", "marshal", "shelve", "joblib", "cloudpickle"}
    found = []
    for name, tree in sources.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found += [f"{name}: import {a.name}" for a in node.names if a.name.split(".")[0] in banned_modules]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in banned_modules:
                found.append(f"{name}: from {node.module} import ...")
        for call, _ in _calls(tree):
            func = _dotted(call.func)
            if func == "torch.load" or func.endswith(".torch.load"):
                value = {k.arg: k.value for k in call.keywords}.get("weights_only")
                if not (isinstance(value, ast.Constant) and value.value is True):
                    found.append(f"{name}:{call.lineno} torch.load without weights_only=True")
            if func == "yaml.load":
                found.append(f"{name}:{call.lineno} yaml.load (use yaml.safe_load)")
    return found


def shell_and_remote_code(sources: dict[str, ast.Module]) -> list[str]:
    """subprocess calls with shell=, and trust_remote_code set to anything but False or a variable."""
    found = []
    for name, tree in sources.items():
        for call, _ in _calls(tree):
            for k in call.keywords:
                constant = k.value.value if isinstance(k.value, ast.Constant) else None
                if k.arg == "shell" and _dotted(call.func).startswith("subprocess.") and constant is not False:
                    found.append(f"{name}:{call.lineno} subprocess with shell=")
                if k.arg == "trust_remote_code" and isinstance(k.value, ast.Constant) and constant is not False:
                    found.append(f"{name}:{call.lineno} trust_remote_code={constant!r}")
    return found


def dynamic_regex_sites(sources: dict[str, ast.Module]) -> set[tuple[str, str]]:
    """(file, function) of every re.* call whose pattern is not a string literal."""
    sites = set()
    for name, tree in sources.items():
        for call, func in _calls(tree):
            dotted = _dotted(call.func)
            if dotted.startswith("re.") and dotted[3:] in RE_CALLS and call.args:
                if not isinstance(call.args[0], ast.Constant):
                    sites.add((name, func))
    return sites


def test_the_scan_sees_the_package_and_flags_what_it_should():
    seen = {"graph/cli/main.py", "nodes/approve.py", "tools/planning/plan_guard.py", "schemas/plans.py", "state.py"}
    assert seen <= set(SOURCES)
    assert not any(name.startswith(("tests/", ".venv/")) for name in SOURCES)
    bad = {
        "bad.py": ast.parse(
            "import pickle\nimport yaml, torch, subprocess, re\n"
            "def f(text, path, plan):\n"
            "    eval(text); exec(text); compile(text, 'x', 'exec')\n"
            "    torch.load(path); torch.load(path, weights_only=False)\n"
            "    yaml.load(text)\n"
            "    subprocess.run(text, shell=True)\n"
            "    AutoModel.from_pretrained(path, trust_remote_code=True)\n"
            "    re.compile(plan['layer'])\n"
        )
    }
    assert len(code_execution(bad)) == 3
    assert len(unsafe_loading(bad)) == 4  # import pickle, two torch.load, yaml.load
    assert len(shell_and_remote_code(bad)) == 2
    assert dynamic_regex_sites(bad) == {("bad.py", "f")}
    good = {"good.py": ast.parse("import torch\ntorch.load(p, weights_only=True)\nload(x, trust_remote_code=flag)\n")}
    assert not unsafe_loading(good) and not shell_and_remote_code(good)


def test_no_eval_exec_or_code_compilation():
    assert not code_execution(SOURCES)


def test_no_pickle_based_loading():
    assert not unsafe_loading(SOURCES)


def test_no_shell_and_no_hard_coded_remote_code():
    assert not shell_and_remote_code(SOURCES)


def test_trust_remote_code_only_with_the_flag():
    from profiling_agent.graph.cli.args import build_parser, input_from_args
    from profiling_agent.state import InputState, ModelRef

    parser = build_parser()
    assert input_from_args(parser.parse_args(["run"]))["model"]["trust_remote_code"] is False
    assert input_from_args(parser.parse_args(["run", "--trust-remote-code"]))["model"]["trust_remote_code"] is True
    assert ModelRef().trust_remote_code is False and InputState.model_validate({}).model.trust_remote_code is False


def test_dynamic_regexes_only_where_guarded():
    sites = dynamic_regex_sites(SOURCES)
    assert ("tools/compression/units.py", "_parse_entry") in sites  # the scan finds the plan-applying sites
    unexpected = sites - set(DYNAMIC_REGEX_SITES)
    assert not unexpected, f"regex patterns from data outside the guarded sites: {sorted(unexpected)}"


def test_plan_regexes_are_length_limited_and_checked():
    from pydantic import ValidationError

    from profiling_agent.state import MAX_REGEX_LEN, PruneEntry, QuantEntry
    from profiling_agent.tools.planning.regex_safety import regex_problem
    from profiling_agent.tools.planning.review import review_plan

    for model in (PruneEntry, QuantEntry):
        kwargs = {"type": "structured", "ratio": 0.5} if model is PruneEntry else {}
        with pytest.raises(ValidationError):
            model(layer="a" * (MAX_REGEX_LEN + 1), **kwargs)
    for pattern in ("(a+)+$", "(.*)*x", "(a|a)*b", "(?P<x>a)(?P=x)", "[", "a" * 300):
        assert regex_problem(pattern), pattern
    profile = {
        "groups": [{"name": "g", "kind": "structured", "module": "enc.0.mlp", "units": 8, "min_units": 1}],
        "protected": ["classifier"],
        "group_costs": {"g": {"params_share": 0.5, "macs_share": 0.5, "latency_share": 0.5}},
        "layers": [{"name": "enc.0.mlp", "type": "Linear"}, {"name": "classifier", "type": "Linear"}],
    }
    unsafe = {"pruning": [{"layer": "(e+)+$", "type": "structured", "ratio": 0.5}]}
    assert not review_plan(unsafe, profile).ok
    safe = {"pruning": [{"layer": r"^enc\.0\.mlp$", "type": "structured", "ratio": 0.5}]}
    verdict = review_plan(safe, profile)
    assert verdict.ok and verdict.estimate["params"] == pytest.approx(0.25)
