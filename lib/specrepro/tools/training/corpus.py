"""The embedded model's training corpus: math, code and prose, with held-out splits.

Design:
- Three domains, each a list of documents:
  math  = GSM8K rows, question + worked answer (with `<<…>>` and `#### N`); train
          split -> training, test split -> held out (the harness's prompts are never
          trained on);
  code  = the running interpreter's standard library source: the sorted `.py`
          files outside test folders, every `code_stride`-th held out, the rest
          taken in sorted order up to `code_chars`;
  prose = WikiText-2 (valid + test), detokenized, split into articles at top-level
          headings; every `prose_holdout_every`-th article held out (20,
          `prose_heldout`; the `prose` workload continues them). `prose_docs`
          chooses the document unit: "articles" (the default corpus), "sections"
          (an article cut at every heading, the heading kept with its text) or
          "paragraphs" (every paragraph, a heading joined to the paragraph after
          it). Smaller units put an end-of-text after every few hundred tokens of
          prose, so the target learns to end prose instead of looping past its
          end (greedy prose that never meets an end-of-text repeats itself, and
          repetition is easy to draft: it inflates acceptance). Held-out
          assignment stays per article, so every unit of a held-out article is
          held out in all three modes.
- Documents are written one JSON object a line (`domain`, `split`, `source`,
  `text`) to a single file, with `<file>.json` beside it holding its sha256, the
  Python version (the standard library differs between versions: build once,
  train from the file) and the sizes. Training joins documents with the
  end-of-text token so the model learns to end a document.
- Reading the datasets goes through `specrepro.data` (imported inside the builder,
  so training on the GPU box needs only the written file).
- Command: `python -m specrepro.tools.training.corpus --out FILE [--prose-docs UNIT]`.
  This module imports the standard library only (the package's `__init__` imports
  nothing), so building the corpus needs no torch.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import sysconfig
from dataclasses import asdict, dataclass
from pathlib import Path

# the WikiText-2 article structure and the held-out rule live with the data (data.py): the
# `prose` workload (workloads.py) continues the held-out articles and reads them from there
from specrepro.data import (
    PROSE_DOCS,
    PROSE_HOLDOUT_EVERY,
    article_units,
    prose_heldout,
    wikitext_articles,
)

DOMAINS = ("math", "code", "prose")
SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}


@dataclass(frozen=True)
class Document:
    domain: str  # math | code | prose
    split: str  # train | heldout
    source: str  # where it came from: "gsm8k/train:17", "json/decoder.py", "wikitext-2/valid:3"
    text: str


# --------------------------------------------------------------------------- domains
def gsm8k_text(row: dict) -> str:
    return f"Question: {row['question'].strip()}\nAnswer: {row['answer'].strip()}"


def math_documents(data_dir=None, limit: int | None = None) -> list[Document]:
    from specrepro.data import read_gsm8k

    docs = []
    for split, name in (("train", "train"), ("test", "heldout")):
        rows = read_gsm8k(split, data_dir)[:limit]
        docs += [Document("math", name, f"gsm8k/{split}:{i}", gsm8k_text(r))
                 for i, r in enumerate(rows)]
    return docs


def stdlib_files(root: Path | None = None) -> list[Path]:
    """The standard library's .py files outside test folders, sorted by path."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    return [p for p in sorted(root.rglob("*.py"))
            if not (set(p.relative_to(root).parts[:-1]) & SKIP_DIRS)
            and not p.name.startswith("test_")]


def code_documents(code_chars: int = 6_000_000, stride: int = 25, max_file_chars: int = 120_000,
                   root: Path | None = None) -> list[Document]:
    root = Path(root or sysconfig.get_paths()["stdlib"])
    docs, used = [], 0
    for i, path in enumerate(stdlib_files(root)):
        text = path.read_text(encoding="utf-8", errors="replace").strip()
        if not text or len(text) > max_file_chars:
            continue
        rel = path.relative_to(root).as_posix()
        if i % stride == stride // 2:
            docs.append(Document("code", "heldout", rel, text))
        elif used < code_chars:
            docs.append(Document("code", "train", rel, text))
            used += len(text)
    return docs


def prose_documents(data_dir=None, holdout_every: int = PROSE_HOLDOUT_EVERY,
                    limit: int | None = None,
                    prose_docs: str = "articles") -> list[Document]:
    from specrepro.data import detokenize_wikitext, read_wikitext

    docs = []
    for split in ("valid", "test"):
        arts = wikitext_articles(detokenize_wikitext(read_wikitext(split, data_dir)))[:limit]
        for i, a in enumerate(arts):
            name = "heldout" if prose_heldout(i, holdout_every) else "train"
            units = article_units(a, prose_docs)
            # The default corpus keeps its sources ("wikitext-2/valid:3"), so its bytes and
            # hash do not change; units are numbered after "#".
            docs += [Document("prose", name, f"wikitext-2/{split}:{i}"
                              + ("" if prose_docs == "articles" else f"#{j}"), u)
                     for j, u in enumerate(units)]
    return docs


def build_corpus(data_dir=None, code_chars: int = 6_000_000, limit: int | None = None,
                 stdlib_root: Path | None = None, prose_docs: str = "articles") -> list[Document]:
    """All documents, in a fixed order. `limit` caps rows/articles per source (tests)."""
    code = code_documents(code_chars, root=stdlib_root)
    if limit is not None:
        code = ([d for d in code if d.split == "train"][:limit]
                + [d for d in code if d.split == "heldout"][:limit])
    return (math_documents(data_dir, limit) + code
            + prose_documents(data_dir, limit=limit, prose_docs=prose_docs))


# --------------------------------------------------------------------------- file
def write_corpus(docs: list[Document], path: str | Path, options: dict | None = None) -> dict:
    """Write the documents (JSON lines) and `<path>.json` (hash, sizes); return the latter.

    `options`: how the corpus was built, when not the default (e.g. {"prose_docs":
    "sections"}); recorded in the manifest so training can check it matches the recipe.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(json.dumps(asdict(d), ensure_ascii=False) + "\n" for d in docs).encode()
    path.write_bytes(data)
    sizes: dict = {}
    for d in docs:
        s = sizes.setdefault(d.domain, {}).setdefault(d.split, {"documents": 0, "chars": 0})
        s["documents"] += 1
        s["chars"] += len(d.text)
    manifest = {"file": path.name, "sha256": hashlib.sha256(data).hexdigest(),
                "bytes": len(data), "python": platform.python_version(), "sizes": sizes,
                **(options or {})}
    Path(f"{path}.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def read_corpus(path: str | Path, check: bool = True) -> tuple[list[Document], dict]:
    """The documents and the manifest; with `check`, the file must match its sha256."""
    path = Path(path)
    data = path.read_bytes()
    mpath = Path(f"{path}.json")
    manifest = json.loads(mpath.read_text()) if mpath.is_file() else {}
    digest = hashlib.sha256(data).hexdigest()
    if check and manifest and manifest.get("sha256") != digest:
        raise ValueError(f"{path}: sha256 {digest} differs from {mpath} ({manifest['sha256']})")
    manifest.setdefault("sha256", digest)
    docs = [Document(**json.loads(line)) for line in data.decode().split("\n") if line]
    return docs, manifest


def split_docs(docs: list[Document], split: str, domain: str | None = None) -> list[str]:
    return [d.text for d in docs if d.split == split and (domain is None or d.domain == domain)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specrepro.tools.training.corpus",
                                 description="build the embedded model's training corpus")
    ap.add_argument("--out", required=True, help="corpus file to write (JSON lines)")
    ap.add_argument("--data-dir", default=None, help="default: $SPECREPRO_DATA_DIR")
    ap.add_argument("--code-chars", type=int, default=6_000_000)
    ap.add_argument("--prose-docs", choices=PROSE_DOCS, default="articles",
                    help="prose document unit (default: articles, the shipped corpus);"
                         " recipes.py's recipe v2 wants sections")
    args = ap.parse_args(argv)
    docs = build_corpus(args.data_dir, args.code_chars, prose_docs=args.prose_docs)
    options = None if args.prose_docs == "articles" else {"prose_docs": args.prose_docs}
    manifest = write_corpus(docs, args.out, options)
    print(json.dumps(manifest, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
