"""The base models every record of the state derives from: strict (an unknown key is refused) and JSON-only."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator


class Strict(BaseModel):
    """A model that refuses keys it does not declare (a typo or another version's key fails loudly)."""

    model_config = ConfigDict(extra="forbid")


class Ref(Strict):
    """A reference that may also be given as its bare string."""

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, data: Any) -> Any:
        return {"ref": data} if isinstance(data, str) else data
