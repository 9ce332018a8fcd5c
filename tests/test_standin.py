"""The stand-in (tools/export/inflate.py, standin.py): the trained checkpoint inflated to a
declared byte budget computes what the original computes. Proved on the real `models/embedded`:
the command at the issue's size (0.05 GiB) loads in transformers with the original's logits;
a 0.12-GiB stand-in with 3 hidden copies, twin heads, twin neurons and 2 twin layers gives the
original's logits and 3 copies of its hidden states on real text, and the embedded engine's
greedy output and every drafter's acceptance equal the original's under every method; no
weight is zero padding, twin units have the twin structure; the byte accounting equals the
written bytes and the default budget plans a 21-GiB, 37-layer target; the budget file is
validated naming file and key; the recipe keys the fingerprint; a current folder is kept."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from conftest import random_prompts
from specrepro import identity
from specrepro.embedded.checkpoint import load_target
from specrepro.embedded.config import EngineConfig
from specrepro.embedded.engine import LLMEngine
from specrepro.embedded.sampling import SamplingParams
from specrepro.embedded.tokenizer import Tokenizer
from specrepro.tools.export import standin as es
from specrepro.tools.export.inflate import head_pairs

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROOT = Path(__file__).resolve().parents[1]
CKPT = ROOT / "models" / "embedded"
BUDGET = ROOT / es.DEFAULT_BUDGET
GIB = 2**30
TEXTS = {  # real prompts: GSM8K-like, Python, prose
    "math": "Question: Natalia sold clips to 48 of her friends in April, and then she sold half "
            "as many clips in May. How many clips did Natalia sell altogether?\nAnswer:",
    "code": "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + ",
    "prose": "The old lighthouse keeper climbed the stairs every evening, watching the ships "
             "drift slowly past the rocky shore while",
}
PARTS = ("target", "target/dflash", "target/dflash_light", "target/mtp", "target/draft_model",
         *(f"{e}/{n}" for e in ("vllm", "sglang") for n in ("dflash", "dflash_light", "mtp")))


def ids_of(text: str) -> torch.Tensor:
    return torch.tensor([Tokenizer.load(CKPT).encode(text)])


def small_budget(path: Path) -> Path:
    """The default budget at 0.12 GiB: 3 hidden copies, 8 layers (2 twin), 3-layer draft model."""
    raw = yaml.safe_load(BUDGET.read_text())
    raw["target"].update(gib=0.12, hidden_copies=3, kv_bytes_per_token=8192)
    raw["drafters"]["draft_model"].update(hidden_copies=3, layers=3)
    path.write_text(yaml.safe_dump(raw))
    return path


def layer_params(s, intermediate: int | None = None) -> int:
    """One Qwen3 layer's parameters, counted here from the shapes: q, k, v, o, QK norms, MLP,
    two norms."""
    i = s.intermediate if intermediate is None else intermediate
    return s.width * s.head_dim * 2 * (s.heads + s.kv_heads) + 2 * s.head_dim \
        + 3 * s.width * i + 2 * s.width


def target_bytes(p, vocab: int) -> int:  # untied embedding and head, final norm, layers
    return 2 * (2 * vocab * p.target.width + p.target.width + p.layers * layer_params(p.target))


def dflash_bytes(p) -> int:  # fc over 3 target layers, hidden_norm and norm, its layers
    w = p.dflash.width
    return 2 * (3 * w * w + 2 * w + p.dflash_layers * layer_params(p.dflash))


@pytest.fixture(scope="module")
def cli_out(tmp_path_factory):
    """`specrepro export-standin --out DIR --target-gib 0.05` run from the repo root."""
    out = tmp_path_factory.mktemp("cli") / "si"
    buf = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(buf):
        mp.chdir(ROOT)
        rc = es.main(["--out", str(out), "--target-gib", "0.05"])
    return out, rc, buf.getvalue()


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """The 0.12-GiB stand-in: its folder and export summary."""
    d = tmp_path_factory.mktemp("small")
    meta = es.export_standin(d / "si", budget_path=small_budget(d / "b.yaml"), checkpoint=CKPT)
    assert meta["written"]
    return d / "si", meta


@pytest.fixture(scope="module")
def original():
    return load_target(CKPT, dtype=torch.float32)[0]


# --------------------------------------------------------------------------- exactness
def test_the_command_at_the_issue_s_size_loads_in_transformers_with_the_original_logits(
        cli_out):
    import transformers

    out, rc, printed = cli_out
    assert rc == 0, printed
    assert any(line.startswith("| target |") for line in printed.splitlines()), printed
    assert json.loads((out / "target/config.json").read_text())["tie_word_embeddings"] is False
    top = json.loads((out / es.RECIPE).read_text())
    for part in PARTS:  # every folder carries its recipe, the top one's, with true sizes
        meta = json.loads((out / part / es.RECIPE).read_text())
        assert meta["part"] == part and meta["recipe"] == top["recipe"], part
        assert all((out / part / f).stat().st_size == n for f, n in meta["files"].items()), part
    hf = {d: transformers.AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32).eval()
          for d in (CKPT, out / "target")}
    assert hf[out / "target"].config.intermediate_size > hf[CKPT].config.intermediate_size
    for name, text in TEXTS.items():
        ids = ids_of(text)
        with torch.no_grad():
            a, b = (hf[d](ids).logits for d in (CKPT, out / "target"))
        diff = (a - b).abs().max().item()
        assert diff <= 1e-4, f"{name}: transformers' logits differ by {diff:.3g}"
        assert torch.equal(a.argmax(-1), b.argmax(-1)), f"{name}: argmax differs (max {diff:.3g})"


def test_hidden_copies_and_twin_layers_keep_logits_and_copy_hidden_states(small, original):
    out, _ = small
    model, _ = load_target(out / "target", dtype=torch.float32)
    c = model.config
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads) \
        == (1152, 8, 12, 4), c
    for name, text in TEXTS.items():
        ids = ids_of(text)
        with torch.no_grad():
            a = original(ids, hidden_layers=(1, 2, 4))
            b = model(ids, hidden_layers=(1, 2, 4))
        diff = (a.logits - b.logits).abs().max().item()
        assert diff <= 1e-4, f"{name}: logits differ by {diff:.3g}"
        assert torch.equal(a.logits.argmax(-1), b.logits.argmax(-1)), f"{name}: argmax differs"
        for layer, ha, hb in zip((1, 2, 4), a.hidden, b.hidden):
            hdiff = (hb - ha.repeat(1, 1, 3)).abs().max().item()
            assert hb.shape[-1] == 3 * ha.shape[-1] and hdiff <= 1e-4, \
                f"{name}: layer {layer}'s hidden state is no 3 copies ({hdiff:.3g})"


def run(model_dir: Path, method: str, prompts: list[list[int]]):
    spec = None if method == "none" else {
        "method": "dflash" if method == "dflash_light" else method,
        "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    if method == "dflash_light":
        spec["model"] = "dflash_light"
    eng = LLMEngine(EngineConfig(model_dir=str(model_dir), max_num_seqs=4, max_model_len=128,
                                 speculative=spec))
    return eng.generate(prompts, SamplingParams(temperature=0.0), 16, ignore_eos=True), eng.stats


def test_the_engine_s_greedy_output_and_acceptance_equal_the_original_s(small):
    """Greedy output equal to the original target's alone catches a wrong target; acceptance
    equal to the original drafter's (same drafts) catches a wrong drafter."""
    out, _ = small
    prompts = [ids_of(t)[0].tolist() for t in TEXTS.values()] + random_prompts(3, seed=7)
    ref, _ = run(CKPT, "none", prompts)
    for method in ("none", "ngram", "mtp", "dflash", "dflash_light", "draft_model"):
        got, stats = run(out / "target", method, prompts)
        bad = [i for i, (a, b) in enumerate(zip(ref, got)) if a != b]
        assert not bad, f"{method}: prompts {bad} differ from the original's greedy output"
        if method != "none":
            _, orig = run(CKPT, method, prompts)
            assert stats.num_draft_tokens > 0, method
            assert (stats.num_draft_tokens, stats.num_accepted_tokens) == \
                (orig.num_draft_tokens, orig.num_accepted_tokens), \
                f"{method}: stand-in drafted/accepted {stats}, original {orig}"


# --------------------------------------------------------------------------- structure
def test_no_zero_padding_and_twin_units_are_twins(small):
    out, _ = small
    sd = load_file(str(out / "target/model.safetensors"))
    for key, t in sd.items():
        zeros = (t == 0).float().mean().item()
        assert zeros < 0.01, f"{key}: {zeros:.1%} exact zeros"
        if t.dim() == 2:
            assert not (t == 0).all(1).any() and not (t == 0).all(0).any(), \
                f"{key}: an all-zero row or column"
    for i in (6, 7):  # twin layers: every neuron and head in pairs
        g = sd[f"model.layers.{i}.mlp.gate_proj.weight"]
        u = sd[f"model.layers.{i}.mlp.up_proj.weight"]
        down = sd[f"model.layers.{i}.mlp.down_proj.weight"]
        assert g.shape == (1280, 1152) and down.shape == (1152, 1280)
        assert torch.equal(g[0::2], g[1::2]) and torch.equal(u[0::2], u[1::2]), i
        assert torch.equal(down[:, 0::2], -down[:, 1::2]), i
        assert not torch.equal(g[0], g[2])  # pairs differ from one another
        k = sd[f"model.layers.{i}.self_attn.k_proj.weight"].view(4, 64, 1152)
        q = sd[f"model.layers.{i}.self_attn.q_proj.weight"].view(12, 64, 1152)
        o = sd[f"model.layers.{i}.self_attn.o_proj.weight"].view(1152, 12, 64)
        assert torch.equal(k[0], k[1]) and torch.equal(k[2], k[3]) and not torch.equal(k[0], k[2])
        for a, b in head_pairs(0, 12, 4)[0]:
            assert torch.equal(q[a], q[b]) and torch.equal(o[:, a], -o[:, b]), (i, a, b)
    emb, head = sd["model.embed_tokens.weight"], sd["lm_head.weight"]  # D' = 3 x 384
    assert torch.equal(emb[:, :384], emb[:, 384:768]) and torch.equal(emb[:, :384], emb[:, 768:])
    assert torch.equal(head[:, 384:768], -head[:, 768:])


# --------------------------------------------------------------------------- budget and plan
def _broken(tmp_path: Path, name: str, edit) -> Path:
    raw = yaml.safe_load(BUDGET.read_text())
    raw = edit(raw) or raw
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize("name, edit, key", [
    ("unknown", lambda r: r["target"].update(layers=9), "target.layers"),
    ("missing", lambda r: r["drafters"]["mtp"].clear(), "drafters.mtp.target_layers"),
    ("type", lambda r: r["target"].update(hidden_copies="13"), "target.hidden_copies"),
    ("low", lambda r: r.update(seed=-1), "seed"),
    ("nan", lambda r: r["target"].update(gib=float("nan")), "target.gib"),
    ("inf", lambda r: r["drafters"]["dflash"].update(share_of_target=float("inf")),
     "drafters.dflash.share_of_target"),
    ("not_a_mapping", lambda r: [1, 2], "mapping"),
])
def test_a_bad_budget_file_is_refused_naming_file_and_key(tmp_path, name, edit, key):
    path = _broken(tmp_path, name, edit)
    with pytest.raises(ValueError) as err:
        es.load_budget(path)
    assert str(path) in str(err.value) and key in str(err.value), str(err.value)


def test_the_accounting_is_the_written_bytes(small):
    out, meta = small
    p = es.plan(es.load_budget(out.parent / "b.yaml"), *es._sources(CKPT)[:2])
    assert meta["bytes"]["target"] == target_bytes(p, 4096)
    assert meta["bytes"]["dflash"] == dflash_bytes(p)
    assert 0.9 <= meta["bytes"]["target"] / (0.12 * GIB) <= 1.0, meta["bytes"]
    size = (out / "target/model.safetensors").stat().st_size  # the bytes and a header
    assert 0 < size - meta["bytes"]["target"] < 2**20, size


def test_the_default_budget_plans_a_21_gib_37_layer_target():
    src, drafters, _ = es._sources(CKPT)
    p = es.plan(es.load_budget(BUDGET), src, drafters)
    t = target_bytes(p, src.vocab_size)
    assert abs(t / (21 * GIB) - 1) < 0.01, f"{t / GIB:.3f} GiB"
    assert p.layers == 37 and p.target.width == 4992, p
    kv = 2 * p.layers * p.target.kv_heads * p.target.head_dim * 2
    assert abs(kv / 38090 - 1) < 0.01, kv
    assert abs(dflash_bytes(p) / t - 0.15) < 0.01, dflash_bytes(p) / t


def test_a_target_below_the_smallest_stand_in_is_refused_before_writing(tmp_path):
    with pytest.raises(ValueError, match="--target-gib"):
        es.export_standin(tmp_path / "si", 0.001, BUDGET, CKPT)
    assert list(tmp_path.iterdir()) == []


def test_twin_heads_pair_within_a_group_or_over_twin_kv_heads():
    assert head_pairs(2, 12, 4) == ([(6, 9), (7, 10), (8, 11)], [(2, 3)])  # group 3: odd
    for first, heads, kv in ((0, 4, 2), (1, 4, 2), (1, 8, 2)):  # group even: inside a group
        q, kvs = head_pairs(first, heads, kv)
        g = heads // kv
        assert kvs == [] and q == [(h, h + 1) for h in range(first * g, heads, 2)]
        assert all(a // g == b // g >= first for a, b in q)
    with pytest.raises(ValueError, match="in pairs"):
        head_pairs(1, 12, 4)  # 3 new KV heads, group 3


# --------------------------------------------------------------------------- identity, reuse
def test_the_fingerprint_is_the_recipe_s(small, cli_out, tmp_path, monkeypatch):
    out, _ = small
    cli, _, _ = cli_out

    def no_hashing(*a):
        raise AssertionError("a stand-in's files were hashed")
    with monkeypatch.context() as mp:
        mp.setattr(identity, "_file_digest", no_hashing)
        fp = identity.local_model_fingerprint(str(out / "target"))
        assert fp == identity.digest("standin", identity.standin_recipe(out / "target"))
        assert identity.local_model_fingerprint(str(out / "vllm/dflash")) != fp  # the part counts
        same = es.export_standin(tmp_path / "same", 0.05, BUDGET, CKPT)
        other = es.export_standin(tmp_path / "seed1", 0.05, BUDGET, CKPT, seed=1)
        assert same["written"] and other["written"]
        fp05 = identity.local_model_fingerprint(str(cli / "target"))
        assert identity.local_model_fingerprint(str(tmp_path / "same/target")) == fp05 != fp
        assert identity.local_model_fingerprint(str(tmp_path / "seed1/target")) != fp05
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    identity._fingerprint.cache_clear()
    assert identity.local_model_fingerprint(str(copy / "target")) == fp  # sizes as recorded
    (copy / "target/model-00002-of-00002.safetensors").write_bytes(b"\0")  # a file it never had
    assert identity.standin_recipe(copy / "target") is None
    (copy / "target/model-00002-of-00002.safetensors").unlink()
    assert identity.standin_recipe(copy / "target") is not None
    with open(copy / "target/model.safetensors", "ab") as f:
        f.write(b"\0")
    assert identity.standin_recipe(copy / "target") is None
    identity._fingerprint.cache_clear()
    hashed = identity.local_model_fingerprint(str(copy / "target"))
    assert hashed is not None and hashed != fp


def test_a_current_stand_in_is_left_alone_and_force_rewrites(cli_out):
    out, _, _ = cli_out
    weights = out / "target/model.safetensors"
    before = weights.stat()
    again = es.export_standin(out, 0.05, BUDGET, CKPT)  # other path spellings, same recipe
    assert again["written"] is False and weights.stat().st_mtime_ns == before.st_mtime_ns
    buf = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(buf):
        mp.chdir(ROOT)
        assert es.main(["--out", str(out), "--target-gib", "0.05"]) == 0
    assert "is current" in buf.getvalue() and weights.stat().st_mtime_ns == before.st_mtime_ns
    forced = es.export_standin(out, 0.05, BUDGET, CKPT, force=True)
    after = weights.stat()
    assert forced["written"] is True
    assert (after.st_ino, after.st_mtime_ns) != (before.st_ino, before.st_mtime_ns)
    assert forced["recipe"] == again["recipe"]


def test_the_h200_bench_plan_names_shipped_profiles_and_its_own_servers():
    """params/standin/bench-h200.yaml (scripts/bench_standin.py's plan): every server is a
    shipped profile that validates, every cell names a server of its phase."""
    from specrepro.params.resolve import load_profile

    plan = yaml.safe_load((ROOT / "params/standin/bench-h200.yaml").read_text())
    assert {"roofline", "drafters", "cost", "embedded", "sglang-dflash"} <= set(plan["phases"])
    for name, phase in plan["phases"].items():
        ports = [s["port"] for s in phase["servers"].values()]
        assert len(set(ports)) == len(ports), f"phase {name}: two servers on one port"
        for server in phase["servers"].values():
            prof = load_profile(ROOT / "params/profiles" / f"{server['profile']}.yaml")
            assert "standin" in prof.model.id or prof.model.id == "models/embedded", prof.name
        for cell in phase["cells"]:
            assert cell["server"] in phase["servers"] and cell["kind"] in ("speed", "accept")


def test_the_bench_runs_where_polars_is_absent():
    """scripts/bench_standin.py runs in an engine bundle's Python on the GPU machine, which has
    no polars: the harness modules it imports must not pull the results store in."""
    import os
    import subprocess
    import sys

    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'polars': raise ModuleNotFoundError(name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "from specrepro.harness import cells, promtext\n"
        "from specrepro.harness.loadgen import LoadConfig, LoadGenerator\n"
        "from specrepro.harness.engines import launch\n"
        "from specrepro.params.resolve import load_profile\n"
        "from specrepro.workloads import build_workload\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT / "lib")})
    assert r.returncode == 0, r.stderr[-2000:]
