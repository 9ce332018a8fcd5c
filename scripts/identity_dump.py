"""Print what every suite would measure: each cell's id and each arm's rendered argv.

For every suite under params/ (each notebook and study it binds), one line per cell
(`cell <suite> <study> <cell id>`, the id the results store keys it by, for the engine
version the arm's profile names) and one per arm (`argv <suite> <study> <arm> <argv>`).
Nothing is started. Two checkouts that print the same lines measure the same cells with
the same commands: a restructuring is behaviour-preserving in this respect when
`diff before.txt after.txt` is empty.

    python scripts/identity_dump.py > identities.txt
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> int:
    from specrepro import identity
    from specrepro.harness.engines import render_argv
    from specrepro.params import ParamsError, load_suite, resolve_study

    root = Path(__file__).resolve().parents[1]
    for path in sorted((root / "params").glob("*.yaml")):
        try:
            suite = load_suite(path)
        except ParamsError as e:
            print(f"suite {path.name} does not load: {e}".replace("\n", " "))
            continue
        for nb in [*suite.notebooks, *suite.studies]:
            study = resolve_study(suite, nb)
            for arm in study.arms:
                try:
                    argv = render_argv(arm.resolved, path)
                except Exception:  # an in-process peer (transformers) has no argv: say so
                    argv = ["<no argv: not an HTTP server>"]
                print(f"argv {path.name} {nb} {arm.name} {json.dumps(argv)}")
            for cell in study.cells():
                version = cell.arm.resolved.engine_version  # a resolved study's arms
                print(f"cell {path.name} {nb} {identity.cell_id(study, cell, version)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
