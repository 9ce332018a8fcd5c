"""The one rule for a name that becomes a folder under the results folder.

A study's, a run's, an arm's and a profile's name (and a suite's, under reports/) is one
folder or file name, never a path (`../x`, `a/b`, `.`), so nothing measured is written
outside the folder it belongs in. The params models check a file's names with it
(`params/strict.FolderName`: file and key named), the run command its `--run-id`, and the
store whatever reaches it. Here, in a module that imports nothing, so that the params
models (and the bench, which runs where polars is absent) need not import the store.
"""

from __future__ import annotations

NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.+-]*"
