"""The corpus: deterministic (same hash twice), held-out splits per domain, hash checked."""

import json
import os

import pytest

from specrepro.tools.training import corpus

DATA = os.environ.get("SPECREPRO_DATA_DIR")


def fake_stdlib(root):
    for rel in ["a.py", "pkg/b.py", "pkg/test_c.py", "test/d.py", "z.py"] + [
            f"m{i:02d}.py" for i in range(30)]:
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f"# {rel}\nx = {len(rel)}\n")
    return root


def test_code_documents_skip_tests_and_hold_out(tmp_path):
    root = fake_stdlib(tmp_path / "lib")
    docs = corpus.code_documents(code_chars=10_000, stride=25, root=root)
    names = [d.source for d in docs]
    assert "pkg/test_c.py" not in names and "test/d.py" not in names
    assert names == sorted(names)
    assert {d.split for d in docs} == {"train", "heldout"}


def test_same_hash_twice_and_checked(tmp_path):
    root = fake_stdlib(tmp_path / "lib")
    docs = corpus.code_documents(root=root)
    m1 = corpus.write_corpus(docs, tmp_path / "a.jsonl")
    m2 = corpus.write_corpus(corpus.code_documents(root=root), tmp_path / "b.jsonl")
    assert m1["sha256"] == m2["sha256"]
    back, manifest = corpus.read_corpus(tmp_path / "a.jsonl")
    assert back == docs and manifest["sha256"] == m1["sha256"]
    assert json.loads((tmp_path / "a.jsonl.json").read_text())["sizes"]["code"]["train"]
    (tmp_path / "a.jsonl").write_text((tmp_path / "a.jsonl").read_text() + "\n")
    with pytest.raises(ValueError, match="sha256"):
        corpus.read_corpus(tmp_path / "a.jsonl")


def test_wikitext_articles_split_at_top_level_headings():
    text = "= A =\n\nOne.\n\n== Sub ==\n\nTwo.\n= B =\n\nThree.\n"
    arts = corpus.wikitext_articles(text)
    assert [a.splitlines()[0] for a in arts] == ["= A =", "= B ="]
    assert "== Sub ==" in arts[0]


@pytest.mark.skipif(not DATA, reason="SPECREPRO_DATA_DIR not set")
def test_full_domains_deterministic_on_a_slice(tmp_path):
    a = corpus.build_corpus(code_chars=50_000, limit=12)
    b = corpus.build_corpus(code_chars=50_000, limit=12)
    ma = corpus.write_corpus(a, tmp_path / "a.jsonl")
    assert ma["sha256"] == corpus.write_corpus(b, tmp_path / "b.jsonl")["sha256"]
    for dom in corpus.DOMAINS:
        assert ma["sizes"][dom]["train"]["documents"] > 0
        assert ma["sizes"][dom]["heldout"]["documents"] > 0
    math = [d for d in a if d.domain == "math"]
    assert "<<" in math[0].text and "\n#### " in math[0].text
    assert all(d.source.startswith("gsm8k/test") for d in math if d.split == "heldout")


ARTICLE = ("= A =\n\nIntro one.\nIntro two.\n\n== Sub ==\n\nBody one.\nBody two.\n\n"
           "=== Empty ===\n\n=== Deep ===\n\nLast.")


def test_article_units_sections_and_paragraphs():
    assert corpus.article_units(ARTICLE) == [ARTICLE]
    assert corpus.article_units(ARTICLE, "sections") == [
        "= A =\n\nIntro one.\nIntro two.", "== Sub ==\n\nBody one.\nBody two.",
        "=== Deep ===\n\nLast."]
    assert corpus.article_units(ARTICLE, "paragraphs") == [
        "= A =\n\nIntro one.", "Intro two.", "== Sub ==\n\nBody one.", "Body two.",
        "=== Empty ===\n\n=== Deep ===\n\nLast."]
    with pytest.raises(ValueError, match="prose_docs must be one of"):
        corpus.article_units(ARTICLE, "chapters")


def test_options_recorded_in_manifest_only_when_given(tmp_path):
    root = fake_stdlib(tmp_path / "lib")
    docs = corpus.code_documents(root=root)
    assert "prose_docs" not in corpus.write_corpus(docs, tmp_path / "a.jsonl")
    m = corpus.write_corpus(docs, tmp_path / "b.jsonl", {"prose_docs": "paragraphs"})
    assert corpus.read_corpus(tmp_path / "b.jsonl")[1]["prose_docs"] == "paragraphs"
    assert m["sha256"] == corpus.read_corpus(tmp_path / "a.jsonl")[1]["sha256"]


@pytest.mark.skipif(not DATA, reason="SPECREPRO_DATA_DIR not set")
def test_paragraph_prose_keeps_articles_held_out_and_default_sources():
    arts = corpus.prose_documents(limit=12)
    paras = corpus.prose_documents(limit=12, prose_docs="paragraphs")
    assert len(paras) > 5 * len(arts) and all("#" not in d.source for d in arts)
    held = {d.source for d in arts if d.split == "heldout"}
    assert held and {d.source.split("#")[0] for d in paras if d.split == "heldout"} == held
