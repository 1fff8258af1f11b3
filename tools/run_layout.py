"""Every path under a run folder, named once: the run's files, its iteration folders and what each one holds.

Paths are relative names (joined onto the run folder or an iteration folder by the caller) so that the names
recorded in result.json and the checkpointed state stay run-relative. `iteration_name` is the one rule for an
iteration's folder (and the joint timing's key of its candidate): "iter_" and the number in two digits.
"""

from __future__ import annotations

import re
from pathlib import Path

# the run folder's own entries
BASELINE = "baseline"  # the baseline's FP32 artifact
BASELINE_FORMS = "baseline_forms"  # the baseline's backend forms (ort_*, ov_*)
INT8_REUSE = "baseline_forms/int8_reuse"  # the profile's INT8 build, kept for measure_baseline (removed by it)
BASELINE_LOGITS = "baseline_forms/logits"  # the baseline's logits on image sets read more than once
BEST = "best"  # the delivered model's folder
PROFILE = "profile.json"  # the baseline profile
SENSITIVITY = "sensitivity.json"  # the probe's per-group sensitivities
SUBSETS = "subsets.json"  # the dataset's calibration / evaluation / held-out rows
RESULT = "result.json"  # the run's result
RUN_SETTINGS = "run.json"  # the CLI settings a run was started with (read back by resume)
REPORT_MD = "report.md"
REPORT_HTML = "report.html"
PLOTS = "plots"  # the report's figures
FORKS = "forks"  # runs forked from this one

# an iteration folder's entries
PLAN = "plan.json"  # the round's plan ({"iteration", "planner", "plan"})
PRUNED = "pruned"  # the pruned FP32 artifact
RECOVERED = "recovered"  # the recovered FP32 artifact
RECOVERY = "recovery.json"  # the recovery's curve and facts
RECOVERY_STEPS = "recovery_steps"  # resumable distillation steps
RECOVERY_JOB = "recovery_job"  # a distributed distillation job's spec and starting student
VARIANTS = "variants"  # the candidate's backend forms
LLM_TRANSCRIPT = "llm_transcript.jsonl"  # the LLM planner's exchange of the round

_ITERATION = re.compile(r"^iter_(\d+)$")


def iteration_name(iteration: int) -> str:
    """Return an iteration's folder name ("iter_01"); also its candidate's key in the joint timing."""
    return f"iter_{int(iteration):02d}"


def iteration_dir(run_path: str | Path, iteration: int) -> Path:
    """Return the folder of one iteration's files under the run folder."""
    return Path(run_path) / iteration_name(iteration)


def iteration_of(name: str) -> int | None:
    """Return the iteration an entry name ("iter_03") stands for, or None when it is no iteration folder."""
    match = _ITERATION.match(name)
    return int(match.group(1)) if match else None


__all__ = [
    "BASELINE",
    "BASELINE_FORMS",
    "BASELINE_LOGITS",
    "BEST",
    "FORKS",
    "INT8_REUSE",
    "LLM_TRANSCRIPT",
    "PLAN",
    "PLOTS",
    "PROFILE",
    "PRUNED",
    "RECOVERED",
    "RECOVERY",
    "RECOVERY_JOB",
    "RECOVERY_STEPS",
    "REPORT_HTML",
    "REPORT_MD",
    "RESULT",
    "RUN_SETTINGS",
    "SENSITIVITY",
    "SUBSETS",
    "VARIANTS",
    "iteration_dir",
    "iteration_name",
    "iteration_of",
]
