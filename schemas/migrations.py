"""Checkpoint migrations in one place: what changed in the saved state's shape, keyed by the state format version.

A run's state carries `state_format` (`State.state_format`, written by the first node of every run since format 1;
a checkpoint without it is format 0). Each entry of `MIGRATIONS` upgrades a checkpoint from one format to the
next; `graph/checkpoint.py:migrate_checkpoint` applies the ones a resumed thread needs and stamps the current
format. Shapes checked on every read (a renamed history key) are upgraded where the record is validated, through
the same tables.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# the format of the state this version writes; raise it (and add a `Migration`) when a saved shape changes
STATE_FORMAT = 1


@dataclass(frozen=True)
class Migration:
    """What changed between format `since - 1` and format `since`, in data a reader can apply.

    Attributes:
        since: The format this migration upgrades to.
        summary: One line on what changed.
        history_keys: Keys of history events renamed: old key -> today's field.
        renamed_nodes: Nodes renamed: old name -> the node whose router now leads on from where the old one stood.
    """

    since: int
    summary: str
    history_keys: dict[str, str] = field(default_factory=dict)
    renamed_nodes: dict[str, str] = field(default_factory=dict)


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        since=1,
        summary="history events' `planner` became `planner_choice`; the node test_best became evaluate_held_out",
        history_keys={"planner": "planner_choice"},
        renamed_nodes={"test_best": "iterate"},  # both follow iterate's router
    ),
)

# every rename above, whatever format a checkpoint has (each is harmless on a newer one)
LEGACY_HISTORY_KEYS = {old: new for m in MIGRATIONS for old, new in m.history_keys.items()}
RENAMED_NODES = {old: before for m in MIGRATIONS for old, before in m.renamed_nodes.items()}


def pending(saved_format: int | None) -> list[Migration]:
    """Return the migrations a state of `saved_format` (None: unnumbered, format 0) needs, oldest first.

    Raises:
        ValueError: The state was written by a newer version (a format this one does not know).
    """
    have = saved_format or 0
    if have > STATE_FORMAT:
        raise ValueError(
            f"this checkpoint has state format {have}, newer than this version's {STATE_FORMAT}: "
            "resume it with the version of profiling-agent that wrote it"
        )
    return [m for m in MIGRATIONS if m.since > have]


def upgrade_history_event(data: dict[str, Any]) -> dict[str, Any]:
    """Return a history event's keys with the names older formats wrote mapped to today's fields."""
    return {LEGACY_HISTORY_KEYS.get(k, k): v for k, v in data.items()}
