"""The schemas the graph's state holds, split by meaning (the state itself, `State`, is `state.py`).

- `settings`: the choices a run accepts, each a `Literal` defined once (`CONTEXT_CHOICES`: the run context's);
- `base`: the strict base models;
- `inputs`: what to compress and how to judge it (`ModelRef`, `DatasetRef`, `Objective`);
- `plans`: compression plans and what the planners record about a round (`PlannerMeta`, `LLMStep`, trials);
- `planning`: the planners' own currency, never held in the state (`Trial`, `PastRound`);
- `planning_problem`: a round's planning problem, one typed row per group (`PlanningProblem`, `GroupRow`);
- `records`: what flows between nodes (artifacts, data, profile, measurements, candidates, report);
- `migrations`: how older checkpoints' shapes are upgraded, keyed by `STATE_FORMAT`.

These modules import pydantic and each other only (never `profiling_agent.state`); every name is re-exported by
`profiling_agent.state`.
"""
