"""The strict base of every recipe section, and the small field types the sections share.

Here in core (not in ``ortft/recipe/``) because the sections live with what they configure:
the ``data:`` section is ``ortft/data/spec.py``, below the recipe that gathers them.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field


# a recipe section: an unknown key is an error, and so is a bad value assigned later (no
# docstring: pydantic would put it in the JSON schema of every section)
class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


PositiveInt = Annotated[int, Field(ge=1)]
