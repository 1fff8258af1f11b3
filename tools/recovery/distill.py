"""Knowledge distillation from the untouched baseline into a pruned student, bounded, seeded and resumable."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from profiling_agent.tools import interrupt
from profiling_agent.tools.models.training import warmup_cosine_lr
from profiling_agent.tools.recovery import distill_state
from profiling_agent.tools.runtimes.forward import forward_logits, model_device

PROBE_STEPS = 5  # steps timed (median) before the wall-clock budget fixes the step count, once
Batches = Callable[[int], tuple[torch.Tensor, torch.Tensor]]  # step -> (pixels, labels; -1 = no label)


@dataclass
class DistillConfig:
    """How the student is trained; every field is part of the resume fingerprint."""

    steps: int = 100  # optimizer steps (the wall-clock cap may end the run earlier)
    lr: float = 3e-4  # peak AdamW learning rate
    weight_decay: float = 0.0  # fine-tuning a trained model: no decay by default
    warmup: float = 0.1  # fraction of steps with a linear warm-up, then cosine decay to 0
    temperature: float = 2.0  # softens teacher and student logits in the KL term
    kl_weight: float = 1.0  # weight of T^2 * KL(teacher || student)
    ce_weight: float = 0.5  # weight of cross-entropy on labels, where labels exist
    clip: float = 1.0  # gradient-norm clipping
    seed: int = 0  # reseeds torch before every step (dropout), so a resumed run draws the same numbers
    minutes: float = 0.0  # wall-clock budget over all attempts (0: none): fixes the step count once, see distill
    save_every: int = 0  # steps between checkpoints (0: about 20 per run)
    precision: str = "auto"  # the student's forward: bf16 autocast ("bf16"), or "auto" (bf16 on CUDA, else fp32)
    budget_stops: bool = False  # True: the budget only stops the run; the schedule keeps `steps` (see distill)

    def fingerprint(self) -> dict[str, Any]:
        """Return what must match for a saved step to be resumed (the cap and save cadence may change)."""
        skip = ("minutes", "save_every") + (("precision",) if self.precision == "auto" else ())  # as before it was
        skip += () if self.budget_stops else ("budget_stops",)
        return {k: v for k, v in asdict(self).items() if k not in skip}

    def schedule_steps(self, total: int) -> int:
        """Return the length of the learning-rate schedule of a run that does `total` steps."""
        return self.steps if self.budget_stops else total


def distill_loss(
    student: torch.Tensor, teacher: torch.Tensor, labels: torch.Tensor, config: DistillConfig
) -> tuple[torch.Tensor, dict[str, float]]:
    """Return the weighted loss: T^2 KL(softmax(teacher/T) || softmax(student/T)) and CE on labelled images."""
    t = config.temperature
    kl = F.kl_div(
        F.log_softmax(student / t, -1), F.log_softmax(teacher / t, -1), log_target=True, reduction="batchmean"
    )
    loss = config.kl_weight * kl * t * t
    parts = {"kl": float(kl.detach())}
    labelled = labels >= 0
    if config.ce_weight > 0 and bool(labelled.any()):
        ce = F.cross_entropy(student[labelled], labels[labelled])
        loss = loss + config.ce_weight * ce
        parts["ce"] = float(ce.detach())
    return loss, parts


def fresh_parameters(model: nn.Module) -> None:
    """Replace every parameter by a new one with the same values (tied parameters stay tied).

    Pruning that reassigns `param.data` in place (e.g. Swin's relative-position bias table) leaves autograd's
    cached shape of the old parameter behind, and the first backward pass then fails; new parameters do not.
    """
    fresh: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            if id(param) not in fresh:
                fresh[id(param)] = nn.Parameter(param.detach().clone(), requires_grad=param.requires_grad)
            setattr(module, name, fresh[id(param)])


def _train_mode(student: nn.Module) -> None:
    """Train mode with frozen BatchNorm statistics (small batches would spoil them; reconstruction set them)."""
    student.train()
    for module in student.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.eval()


@dataclass
class Progress:
    """The resumable state of one distillation, saved with every checkpoint (JSON; the tensors go beside it).

    `total` is the number of steps the run does. With a wall-clock budget it is decided once, after PROBE_STEPS
    timed steps, from their median time and the time already spent (earlier attempts included), and saved with
    the step that decided it: every later attempt does exactly that many steps, however fast it runs, so a
    resumed run ends at the step an uninterrupted one ends at.
    """

    total: int  # steps this run does (config.steps until the budget decides)
    done: int = 0  # steps finished (the next step to run)
    spent: float = 0.0  # seconds spent in steps, over all attempts
    cpu_spent: float = 0.0  # CPU seconds per torch thread spent in steps (what `budget_stops` counts), all attempts
    decided: bool = False  # whether the budget has fixed `total`
    budget_minutes: float = 0.0  # the budget that fixed `total` (a different one on resume decides again)
    probe_seconds: float = 0.0  # median seconds of the timed steps that decided `total`
    loss: float | None = None  # last step's loss
    agreement: float | None = None  # moving average of top-1 agreement with the teacher, %
    curve: list[list[float]] = field(default_factory=list)  # [step, loss, agreement] per step
    step_seconds: list[float] = field(default_factory=list)  # wall seconds of every step, over all attempts
    attempts: list[dict[str, Any]] = field(default_factory=list)  # {"from": step, "threads": torch threads}
    stopped: str = ""  # "plateau" when the monitor stopped the run before `total`

    @classmethod
    def from_json(cls, saved: dict[str, Any]) -> Progress:
        """Rebuild from a saved step's JSON (unknown keys, e.g. the fingerprint, are ignored)."""
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in saved.items() if k in names})


def decide_total(steps: int, done: int, spent: float, step_seconds: float, budget_s: float) -> int:
    """Return the steps that fit the budget: those done plus what the remaining time allows, at most `steps`."""
    if budget_s <= 0 or step_seconds <= 0:
        return steps
    return max(done, min(steps, done + int(max(0.0, budget_s - spent) / step_seconds)))


def train_step(
    student: nn.Module,
    teacher: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: tuple[torch.Tensor, torch.Tensor],
    config: DistillConfig,
    lr: float,
    *,
    model: nn.Module | None = None,
    scales: tuple[float, float] = (1.0, 1.0),
) -> tuple[float, float]:
    """Run one optimizer step of distillation on a batch; return (loss, top-1 agreement with the teacher in %).

    `batch` is the step's (pixels, labels) on the student's device.

    Pure in the step's inputs (the caller seeds torch from the step). Data-parallel: `model` is the student
    wrapped in DistributedDataParallel, whose backward all-reduces (averages) the gradients before the clipping
    and `optimizer.step`; `scales` multiply the KL and cross-entropy terms so that the average of the ranks'
    gradients is the gradient of the global batch's loss (each rank's share of the images, labelled images).
    """
    pixels, labels = batch
    device = pixels.device
    for group in optimizer.param_groups:
        group["lr"] = lr
    with torch.no_grad():
        teacher_logits = forward_logits(teacher, pixels).float()
    bf16 = config.precision == "bf16" or (config.precision == "auto" and device.type == "cuda")
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        student_logits = forward_logits(model or student, pixels).float()
    if scales != (1.0, 1.0):
        kl_scale, ce_scale = scales
        config = replace(config, kl_weight=config.kl_weight * kl_scale, ce_weight=config.ce_weight * ce_scale)
    loss, _ = distill_loss(student_logits, teacher_logits, labels, config)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    params = [p for group in optimizer.param_groups for p in group["params"]]
    torch.nn.utils.clip_grad_norm_(params, config.clip)
    optimizer.step()
    agree = float((student_logits.argmax(-1) == teacher_logits.argmax(-1)).float().mean()) * 100
    return float(loss.detach()), agree


def _restore(
    folder: Path, key: dict[str, Any], student: nn.Module, optimizer: torch.optim.Optimizer, steps: int, owner: bool
) -> Progress:
    """Load the saved steps of the same distillation (same key), or start afresh (the `owner` clears another's)."""
    peeked = distill_state.peek(folder)
    if peeked is not None and peeked.get("key") == key:
        saved = distill_state.load_latest(folder, student, optimizer)
        assert saved is not None
        restored = Progress.from_json(saved)
        restored.done = int(saved["step"]) + 1  # the saved step folder is what counts
        restored.decided = bool(saved.get("decided", saved.get("fitted", False)))  # "fitted": before 2026-11
        return restored
    if peeked is not None and owner:  # saved by another plan or config: start afresh
        distill_state.clear(folder)
    return Progress(total=steps)


def _rebudget(progress: Progress, config: DistillConfig) -> None:
    """Decide `total` again when a resume brings another budget than the one that decided it."""
    if progress.decided and progress.budget_minutes != config.minutes and progress.done < config.steps:
        budget_s = config.minutes * 60.0
        progress.total = decide_total(config.steps, progress.done, progress.spent, progress.probe_seconds, budget_s)
        progress.budget_minutes = config.minutes


def _alone(values: list[float]) -> list[float]:
    return values


@dataclass
class Team:
    """One rank's part in a data-parallel distillation; the default is a single process (no collective).

    Every rank runs `distill`'s loop on its slice of each step's batch. Rank 0 alone decides the budget, asks to
    halt and saves the steps; `total` sums a few floats over the ranks (how its decisions reach the others and
    how loss and agreement become the global batch's), `wrap` wraps the student for the gradient all-reduce
    (DistributedDataParallel, after a restore) and `scales` gives a step's loss scales from its labels.
    """

    rank: int = 0
    world: int = 1
    total: Callable[[list[float]], list[float]] = _alone
    wrap: Callable[[nn.Module], nn.Module] | None = None
    scales: Callable[[torch.Tensor], tuple[float, float]] | None = None
    halt: Callable[[], bool] | None = None  # rank 0's check after a step: True saves it and stops every rank
    # a single process's check after a step: monitor(steps done, student) -> "stop" ends the run there (plateau)
    monitor: Callable[[int, nn.Module], str | None] | None = None


def distill(
    student: nn.Module,
    teacher: nn.Module,
    batches: Batches,
    config: DistillConfig,
    *,
    checkpoint_dir: Path | None = None,
    fingerprint: dict[str, Any] | None = None,
    progress: Callable[[dict[str, Any]], None] | None = None,
    team: Team | None = None,
) -> dict[str, Any]:
    """Fine-tune `student` in place to match `teacher`'s logits (and the labels), resuming from saved steps.

    AdamW with warm-up and cosine decay, gradient clipping, torch reseeded from (seed, step) before each step;
    batch s is `batches(s)`, so the data position is the step. With `checkpoint_dir`, the student, the optimizer
    state and the `Progress` are saved every `save_every` steps, at the step that fixes the budget and at the
    last step (safetensors + JSON); a later call with the same config and `fingerprint` continues from the last
    saved step (a finished one does nothing), so an interrupted run ends with the weights an uninterrupted one
    would have (up to floating-point nondeterminism of the device). `config.minutes` is a budget applied once:
    after PROBE_STEPS timed steps the step count is fixed to what fits (time already spent counts) and never
    changes again, so neither a slower resumed attempt nor a busier machine cuts the run at another step; the
    run may overrun the budget when its steps get slower. With `config.budget_stops` (automatic recovery, whose
    plateau monitor decides the end) the budget only stops the run, at the step that exhausts it counted in CPU
    seconds per torch thread (time waiting for a core shared with other processes does not count), and the
    schedule always spans `config.steps`: a run the budget does not cut trains the same numbers however busy the
    machine is (a schedule fitted to the timed steps made two runs of the same pruned weights diverge). A stop request
    (`tools.interrupt`) is honoured between steps. The student's forward runs in bfloat16 autocast on CUDA, and on
    the CPU when `config.precision` is "bf16" (the teacher's stays fp32). The student is left in eval mode.

    Args:
        student: The pruned model; trained in place.
        teacher: The untouched baseline; never changed.
        batches: Returns (pixels, labels) of a step; labels of -1 are ignored by the cross-entropy.
        config: Steps, learning rate, loss weights, seed and the wall-clock budget.
        checkpoint_dir: Where steps are saved (None: not resumable).
        fingerprint: Facts that must match for saved steps to be reused (e.g. the student's starting weights).
        progress: Called after each step with {"step", "total", "loss", "agreement"}.
        team: This process's part in a data-parallel job, or a single process's `monitor` (None: the single
            process does it all, unwatched).

    Returns:
        {"steps_planned", "steps_done", "resumed_from", "seconds", "loss", "agreement", "curve", "capped",
        "step_seconds", "attempts", "stopped"} (`capped`: the wall-clock cap cut it; `stopped`: "plateau" or "").

    Raises:
        tools.interrupt.Interrupted: A stop was requested (or the team's rank 0 halted the job); the last saved
            step is where a resume continues.
        OSError: A checkpoint could not be written (e.g. a full disk); nothing half-written is left.
    """
    teacher.eval()
    key = {"config": config.fingerprint(), **(fingerprint or {})}
    team = team or Team()
    optimizer, state = _start(student, config, checkpoint_dir, key, team)
    resumed_from = state.done
    model = team.wrap(student) if team.wrap is not None else None
    run = _Run(student, teacher, batches, config, optimizer, team, model, model_device(student))
    saving = _Saving(checkpoint_dir, key, config.save_every or max(1, config.steps // 20), progress)
    timings: list[float] = []
    _train_mode(student)
    while state.done < state.total:
        interrupt.check()
        step = state.done
        loss, agree, images = _train_one(run, state, timings)
        deciding = run.budget_s > 0 and not config.budget_stops and not state.decided and len(timings) == PROBE_STEPS
        halt = _after_step(state, team, config, (step, loss, agree, images), timings if deciding else None)
        _ask_monitor(state, student, team)
        if config.budget_stops and 0 < run.budget_s <= state.cpu_spent and state.done < state.total:
            state.total = state.done  # the budget ran out: this step is the last (`capped` in the summary)
        _save_and_report(run, saving, state, step, force=deciding or halt)
        if halt:
            raise interrupt.Interrupted(f"rank 0 halted the job after step {state.done}")
    student.eval()
    return _summary(state, config, resumed_from)


@dataclass
class _Run:
    """What every step of one `distill` call trains with (fixed for the call)."""

    student: nn.Module
    teacher: nn.Module
    batches: Batches
    config: DistillConfig
    optimizer: torch.optim.Optimizer
    team: Team
    model: nn.Module | None  # the student as the team wrapped it (DistributedDataParallel), else None
    device: torch.device  # the student's

    @property
    def budget_s(self) -> float:
        """The wall-clock (or, with `budget_stops`, CPU per thread) budget in seconds; 0: none."""
        return self.config.minutes * 60.0


@dataclass(frozen=True)
class _Saving:
    """Where and how often `distill` saves its steps, and whom it tells after each."""

    folder: Path | None  # None: not resumable
    key: dict[str, Any]  # the resume key saved with every step
    every: int  # steps between checkpoints
    progress: Callable[[dict[str, Any]], None] | None


def _train_one(run: _Run, state: Progress, timings: list[float]) -> tuple[float, float, int]:
    """Run the next step (`state.done`), time it and count it; return (loss, agreement %, images) of this rank."""
    config, team = run.config, run.team
    step, tick, cpu_tick = state.done, time.perf_counter(), time.process_time()
    torch.manual_seed(config.seed * 1_000_003 + step)
    pixels, labels = run.batches(step)
    lr = warmup_cosine_lr(step, config.schedule_steps(state.total), config.lr, config.warmup)
    scales = team.scales(labels) if team.scales is not None else (1.0, 1.0)
    batch = (pixels.to(run.device), labels.to(run.device))
    loss, agree = train_step(run.student, run.teacher, run.optimizer, batch, config, lr, model=run.model, scales=scales)
    seconds = time.perf_counter() - tick
    timings.append(seconds)
    state.step_seconds.append(round(seconds, 4))
    state.spent += seconds
    state.cpu_spent += (time.process_time() - cpu_tick) / max(1, torch.get_num_threads())
    state.done = step + 1
    return loss, agree, len(labels)


def _save_and_report(run: _Run, saving: _Saving, state: Progress, step: int, *, force: bool) -> None:
    """Save the step on rank 0 (every `saving.every` steps, at the last one, or when `force`d); report progress."""
    last = state.done >= state.total
    due = state.done % saving.every == 0 or last or force
    if run.team.rank == 0 and saving.folder is not None and due:
        distill_state.save_step(saving.folder, step, run.student, run.optimizer, {**asdict(state), "key": saving.key})
    if saving.progress is not None:
        saving.progress({"step": state.done, "total": state.total, "loss": state.loss, "agreement": state.agreement})


def _ask_monitor(state: Progress, student: nn.Module, team: Team) -> None:
    """Ask a single process's monitor after a step (it checks every K steps itself); "stop" makes this step the last.

    The stop is saved with the step (`stopped` "plateau"), so a resume does not train on; the student goes back to
    training mode after the monitor scored it.
    """
    if team.monitor is None or team.world != 1:
        return
    if team.monitor(state.done, student) == "stop" and state.done < state.total:
        state.total, state.stopped = state.done, "plateau"
    _train_mode(student)


def _after_step(
    state: Progress,
    team: Team,
    config: DistillConfig,
    result: tuple[int, float, float, int],
    timings: list[float] | None,
) -> bool:
    """Fix the step count when `timings` are the probe's, ask rank 0 whether to halt, record the step's figures.

    `result` is this rank's (step, loss, agreement %, images); the global batch's loss and agreement are recorded
    (agreement as a moving average) and whether the job halts is returned. The step count is fixed once, from this
    attempt's timed steps and all the time spent so far; rank 0 decides it and the halt, and `team.total` carries
    them to the other ranks.
    """
    step, loss, agree, images = result
    total, halt = 0, False
    if timings is not None:
        state.probe_seconds = statistics.median(timings)
        if team.rank == 0:
            budget_s = config.minutes * 60.0
            total = decide_total(config.steps, state.done, state.spent, state.probe_seconds, budget_s)
    if team.rank == 0 and team.halt is not None:
        halt = team.halt()
    if team.world > 1:  # the global batch's loss and agreement; rank 0's decisions
        n = float(images)
        loss_sum, agreed, n_all, sent, halts = team.total([loss, agree * n / 100, n, float(total), float(halt)])
        loss, agree, total, halt = loss_sum / team.world, agreed / n_all * 100, int(sent), halts > 0
    if timings is not None:
        state.total, state.decided, state.budget_minutes = total, True, config.minutes
    ema = agree if state.agreement is None else 0.9 * state.agreement + 0.1 * agree
    state.loss, state.agreement = round(loss, 6), round(ema, 3)
    state.curve.append([step, state.loss, state.agreement])
    return halt


def _start(
    student: nn.Module, config: DistillConfig, checkpoint_dir: Path | None, key: dict[str, Any], team: Team
) -> tuple[torch.optim.Optimizer, Progress]:
    """Make the optimizer and restore the saved progress; record a new attempt when steps remain."""
    fresh_parameters(student)
    params = [p for p in student.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    state = Progress(total=config.steps)
    if checkpoint_dir is not None:
        state = _restore(checkpoint_dir, key, student, optimizer, config.steps, owner=team.rank == 0)
    _rebudget(state, config)
    if state.done < state.total:
        attempt = {"from": state.done, "threads": torch.get_num_threads()}
        state.attempts.append(attempt if team.world == 1 else {**attempt, "procs": team.world})
    return optimizer, state


def _summary(state: Progress, config: DistillConfig, resumed_from: int) -> dict[str, Any]:
    """Return `distill`'s summary of a finished run (`capped`: the budget stopped it before `config.steps`)."""
    return {
        "steps_planned": config.steps,
        "steps_done": state.done,
        "resumed_from": resumed_from,
        "seconds": round(state.spent, 3),
        "loss": state.loss,
        "agreement": state.agreement,
        "curve": state.curve,
        "capped": state.done < config.steps and not state.stopped,
        "stopped": state.stopped,
        "step_seconds": state.step_seconds,
        "attempts": state.attempts,
    }
