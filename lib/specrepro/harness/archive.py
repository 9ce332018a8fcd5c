"""An archive of the stores a command writes, rewritten after each cell (`--archive PATH`),
so a machine that is taken back mid-run leaves every cell measured so far in one file.

Design: one .tar.gz, written to a temporary file beside the target, fsynced and renamed over
the last one, so a reader (or a kill) never sees a part of one. Each store goes in settled
(store.settled: no half-written part file) under its study's name.
"""

from __future__ import annotations

import contextlib
import os
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from specrepro.store import ResultStore, settled


@dataclass
class Archive:
    """One .tar.gz of the stores a command writes, rewritten whole (module docstring)."""

    path: Path
    stores: dict[Path, str] = field(default_factory=dict)  # store root -> "<study>/<run_id>"

    def add(self, store: ResultStore) -> None:
        self.stores[store.root] = f"{store.study}/{store.run_id}"

    def write(self) -> None:
        """Temporary file beside the archive, fsync, rename over it: whoever reads it, or
        kills this, finds the previous archive or this one, never a part of one."""
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp",
                                   dir=self.path.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                with tarfile.open(fileobj=fh, mode="w:gz") as tar:
                    for root, name in self.stores.items():
                        if root.is_dir():  # other sessions of the store may be merging
                            with settled(root):
                                _add_store(tar, root, name)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


def _add_store(tar: tarfile.TarFile, root: Path, name: str) -> None:
    """A store's folders and files under `name`, without temporary files (the store writes
    `.<name>.tmp` and then links or renames it: never part of the store). Another session
    writing to the store may remove its temporary file between the listing and the read,
    so a file that is gone by then is left out, never an error."""
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        rel = Path(folder).relative_to(root)
        tar.add(folder, arcname=str(Path(name) / rel), recursive=False)
        for f in sorted(files):
            if f.startswith("."):
                continue
            with contextlib.suppress(FileNotFoundError):
                tar.add(Path(folder) / f, arcname=str(Path(name) / rel / f), recursive=False)
