"""The base of every params model and the constrained numbers the models share.

Design: every model of a params file is `Strict`: pydantic v2 with `extra="forbid"` (an
unknown key fails, with the closest valid one suggested by validation.py) and strict types
(no silent coercion: "8" is not 8); a key it retired (`RETIRED`) fails saying what replaced
it. Checks across fields are each model's `cross_checks()`,
as (key path, message), which the loader locates in the file that set the key. Its own
module so that the profile and suite models (schema.py), the study models (study.py) and the
substrate block (substrate.py) share one base without importing each other.
"""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from specrepro.folder_names import NAME_PATTERN as STORE_NAME
from specrepro.params.errors import Expect


class Strict(BaseModel):
    """Base of every params model: unknown keys fail, no silent type coercion."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=False)
    # Keys the model no longer takes, each with what to write instead: such a key fails
    # with these words (validation.py) rather than as an unknown one.
    RETIRED: ClassVar[dict[str, str]] = {}

    def cross_checks(self) -> list[tuple[tuple, str]]:
        """Checks across fields, as (key path, 'expected ..., found ...'); none by default."""
        return []


PositiveInt = Annotated[int, Field(ge=1)]
NonNegInt = Annotated[int, Field(ge=0)]
PositiveFloat = Annotated[float, Field(gt=0)]

# A name that becomes one folder or file name under the results folder (a suite's run id, a
# study's, an arm's and a profile's name: `<results>/<study>/<run_id>/logs/<arm>--<profile>
# .log`), or a suite's (reports/<suite>/): never a path (`../x`, `a/b`, `.`), so nothing a
# params file names is written outside the folder it belongs in. The store checks the same
# for names from the command line; the rule is folder_names.py's.
NAME_PATTERN = f"^{STORE_NAME}$"
FolderName = Annotated[str, Field(pattern=NAME_PATTERN), Expect(
    "one folder name (letters, digits, '_', '.', '+', '-', not starting with '.' or '-'; "
    "it names a folder or file under the results folder, never a path)")]
