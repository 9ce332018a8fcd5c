"""The speculative-decoding contract (`specrepro.speculative`) against everything that reads it.

The method names, `--speculative-config` keys and the embedded server's command line are
defined once; the embedded adapter, the embedded server's parser, the SGLang and vLLM
adapters and the embedded proposer registry must agree with them. Each test names the side
that drifted and the names that differ.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from specrepro import speculative
from specrepro.harness.engines import ENGINES
from specrepro.harness.engines.embedded import EmbeddedAdapter
from specrepro.harness.engines.sglang import SGLangAdapter
from specrepro.harness.engines.vllm import VLLMAdapter
from specrepro.harness.flags import engine_cli, flag_name
from specrepro.params import ParamsError, Profile, load_profile


def embedded_profile(tmp_path: Path, **fields) -> tuple[Profile, Path]:
    data = {"engine": "embedded", "command": ["{python}", "-m", "specrepro.embedded.serve"],
            "model": {"id": "models/embedded", "revision": None}} | fields
    path = tmp_path / "contract-embedded.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_profile(path), path


def problem_keys(profile: Profile, path: Path) -> set[str]:
    """The keys the adapter's check names; empty when the profile renders."""
    try:
        ENGINES["embedded"].render_argv(profile, path)
    except ParamsError as err:
        return {p.key for p in err.problems}
    return set()


# ------------------------------------------------------ (a) the embedded server's command line


def test_embedded_server_parser_has_exactly_the_contract_flags():
    from specrepro.embedded.serve import build_parser

    parser = build_parser()
    long_options = {o for o in parser._option_string_actions
                    if o.startswith("--") and o != "--help"}
    contract = set(speculative.server_flag_names())
    assert long_options == contract, (
        f"the embedded server's parser and speculative.SERVER_FLAGS differ: only in the "
        f"parser {sorted(long_options - contract)}, only in the contract "
        f"{sorted(contract - long_options)}")


def test_embedded_adapter_accepts_exactly_the_server_flags(tmp_path):
    """Every flag the server has renders; every other flag (all of vLLM's) is refused."""
    reserved = set(EmbeddedAdapter.reserved)
    contract = set(speculative.server_flag_names())
    candidates = {f for f in (contract | set(engine_cli("vllm-0.33.0")["flags"])) - reserved
                  if flag_name(f[2:]) == f}  # a profile's key names it
    profile, path = embedded_profile(tmp_path, flags={f[2:]: True for f in sorted(candidates)})
    refused = {key.removeprefix("flags.") for key in problem_keys(profile, path)}
    accepted = {f for f in candidates if f[2:] not in refused}
    assert accepted == contract - reserved, (
        f"the embedded adapter and speculative.server_flag_names() differ: accepted but not "
        f"in the contract {sorted(accepted - contract)}, in the contract but refused "
        f"{sorted((contract - reserved) - accepted)}")


def test_embedded_adapter_checks_the_contract_choices(tmp_path):
    for flag, choices in speculative.server_flag_choices().items():
        if flag in EmbeddedAdapter.reserved:
            continue
        good, path = embedded_profile(tmp_path, flags={flag[2:]: choices[-1]})
        assert problem_keys(good, path) == set(), f"{flag}={choices[-1]!r} refused"
        bad, path = embedded_profile(tmp_path, flags={flag[2:]: "not-a-choice"})
        assert problem_keys(bad, path) == {f"flags.{flag[2:]}"}, f"{flag}: any value accepted"


def test_embedded_adapter_reads_the_contract_spec_keys_and_precisions(tmp_path):
    # every --speculative-config key the engine reads passes the adapter
    profile, path = embedded_profile(tmp_path, speculative={
        "method": "ngram", "num_speculative_tokens": 4, "num_speculative_tokens_per_batch_size":
        [[1, 4, 4]], "quantization": None, "prompt_lookup_min": 2, "prompt_lookup_max": 4,
        "draft_sample_method": "greedy", "model": "dflash_light"})
    assert set(profile.speculative.model_dump(exclude_none=True)) | {"quantization"} \
        == set(speculative.SPEC_KEYS), "the test's config no longer covers speculative.SPEC_KEYS"
    refused = problem_keys(profile, path)
    assert not refused, f"the embedded adapter refuses {sorted(refused)} of a config in " \
                        f"speculative.SPEC_KEYS {speculative.SPEC_KEYS}"
    for quant in speculative.DRAFTER_QUANTIZATIONS:
        profile, path = embedded_profile(tmp_path, speculative={
            "method": "mtp", "num_speculative_tokens": 3, "quantization": quant})
        assert problem_keys(profile, path) == set(), f"drafter quantization {quant!r} refused"
    profile, path = embedded_profile(tmp_path, speculative={
        "method": "mtp", "num_speculative_tokens": 3, "quantization": "fp8"})
    assert problem_keys(profile, path) == {"speculative.quantization"}


# ------------------------------------------------------------------------ (b) method names


def test_adapters_name_only_contract_methods():
    methods = set(speculative.METHODS)
    assert set(SGLangAdapter.ALGORITHMS) <= methods, (
        f"SGLangAdapter.ALGORITHMS maps methods not in speculative.METHODS: "
        f"{sorted(set(SGLangAdapter.ALGORITHMS) - methods)}")
    assert set(VLLMAdapter.drafter_methods) <= methods, (
        f"VLLMAdapter.drafter_methods names methods not in speculative.METHODS: "
        f"{sorted(set(VLLMAdapter.drafter_methods) - methods)}")
    assert set(speculative.EMBEDDED_METHODS) <= methods
    assert set(speculative.MODEL_METHODS) <= set(speculative.EMBEDDED_METHODS)


def test_contract_methods_are_vllm_spellings_and_sglang_algorithms_exist():
    vllm = set(engine_cli("vllm-0.33.0")["speculative_methods"])
    assert set(speculative.METHODS) <= vllm, (
        f"speculative.METHODS names methods vLLM 0.33.0 lacks: "
        f"{sorted(set(speculative.METHODS) - vllm)}")
    sglang = set(engine_cli("sglang-0.5.23")["speculative_algorithms"])
    assert set(SGLangAdapter.ALGORITHMS.values()) <= sglang, (
        f"SGLangAdapter.ALGORITHMS maps to algorithms SGLang 0.5.23 lacks: "
        f"{sorted(set(SGLangAdapter.ALGORITHMS.values()) - sglang)}")


@pytest.mark.parametrize("method", speculative.METHODS)
def test_embedded_adapter_serves_exactly_the_embedded_methods(tmp_path, method):
    profile, path = embedded_profile(tmp_path, speculative={
        "method": method, "num_speculative_tokens": 3})
    refused = "speculative.method" in problem_keys(profile, path)
    assert refused == (method not in speculative.EMBEDDED_METHODS), (
        f"method {method!r}: the embedded adapter {'refuses' if refused else 'accepts'} it, "
        f"speculative.EMBEDDED_METHODS is {speculative.EMBEDDED_METHODS}")


# ------------------------------------------------------------- (c) the proposer registry


def test_proposer_registry_is_the_embedded_methods():
    from specrepro.embedded.proposers import PROPOSERS

    assert set(PROPOSERS) == set(speculative.EMBEDDED_METHODS), (
        f"embedded.proposers.PROPOSERS and speculative.EMBEDDED_METHODS differ: only in the "
        f"registry {sorted(set(PROPOSERS) - set(speculative.EMBEDDED_METHODS))}, only in the "
        f"contract {sorted(set(speculative.EMBEDDED_METHODS) - set(PROPOSERS))}")


# --------------------------------------------------------- (d) docs/architecture.md beside the code

ARCHITECTURE = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"


def _code_block_after(heading: str) -> str:
    """The first fenced block under a heading of docs/architecture.md."""
    text = ARCHITECTURE.read_text()
    assert heading in text, f"docs/architecture.md has no heading {heading!r}"
    body = text.split(heading, 1)[1]
    return body.split("```", 2)[1]


def test_architecture_lists_exactly_the_server_flags():
    import re

    block = _code_block_after("## Contract: the embedded server's command line")
    documented = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", block))
    contract = set(speculative.server_flag_names())
    assert documented == contract, (
        "docs/architecture.md's server command line and speculative.SERVER_FLAGS differ: "
        f"only in the docs {sorted(documented - contract)}, "
        f"only in the contract {sorted(contract - documented)}")


def test_architecture_lists_exactly_the_engine_config_fields():
    import dataclasses
    import re

    from specrepro.embedded.config import EngineConfig

    block = _code_block_after("## Contract: engine core")
    call = block.split("EngineConfig(", 1)[1].split("))", 1)[0]
    documented = set(re.findall(r"(\w+)=", call))
    fields = {f.name for f in dataclasses.fields(EngineConfig)}
    assert documented == fields, (
        "docs/architecture.md's EngineConfig and embedded/config.py differ: "
        f"only in the docs {sorted(documented - fields)}, only in the code "
        f"{sorted(fields - documented)}")


def test_every_served_method_has_a_valid_speculative_config_example_in_serve_help():
    """`specrepro serve --help` shows one `--speculative-config` per method the embedded engine
    serves, each a config SpecConfig accepts, and the default model is the shipped one."""
    import json

    from specrepro.embedded.serve import build_parser

    methods = set()
    for _, text in speculative.SPEC_CONFIG_EXAMPLES:
        cfg = speculative.SpecConfig.from_dict(json.loads(text))
        methods.add(cfg.method)
    assert methods == set(speculative.EMBEDDED_METHODS)
    parser = build_parser()
    helptext = parser.format_help()
    assert all(text in helptext for _, text in speculative.SPEC_CONFIG_EXAMPLES)
    assert parser.parse_args([]).model == "models/embedded"
