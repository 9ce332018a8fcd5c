"""Every conda environment a profile, a suite, the README or a doc names is created by an
`environment*.yml` file of the repository (its `name:`), so a command copied from any of them
finds its environment."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def created() -> dict[str, str]:
    """name -> the file that creates it."""
    out = {}
    for path in sorted(ROOT.glob("environment*.yml")):
        name = yaml.safe_load(path.read_text())["name"]
        assert name not in out, f"{path.name} and {out.get(name)} both create {name}"
        out[name] = path.name
    return out


def named_in_commands() -> dict[str, set[str]]:
    """conda environment name -> the files whose engine command (`[conda, run, ..., -n,
    NAME, ...]`) names it: every profile and suite under params/."""
    out: dict[str, set[str]] = {}

    def walk(node, where):
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "command" and isinstance(value, list) and value[:1] == ["conda"]:
                    for flag in ("-n", "--name"):
                        if flag in value:
                            out.setdefault(value[value.index(flag) + 1], set()).add(where)
                else:
                    walk(value, where)
        elif isinstance(node, list):
            for item in node:
                walk(item, where)

    for path in sorted((ROOT / "params").rglob("*.yaml")):
        walk(yaml.safe_load(path.read_text()), str(path.relative_to(ROOT)))
    return out


TEXT_NAME = re.compile(r"conda\s+(?:activate|run\b[^\n`]*?(?:-n|--name),?)\s+([\w.-]+)"
                       r"|-n,\s+(specrepro[\w.-]*)")


def named_in_text() -> dict[str, set[str]]:
    """conda environment name -> the README and docs (docs/gpu-box.md, the maintainers' and
    bench notes included) that name it in a command."""
    out: dict[str, set[str]] = {}
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for m in TEXT_NAME.finditer(path.read_text()):
            out.setdefault(m.group(1) or m.group(2), set()).add(path.name)
    return out


def test_the_scan_finds_the_names_in_use():
    # a scan that finds nothing passes trivially: these are named today
    assert {"specrepro-vllm-0.27.1", "specrepro-vllm-0.28.0", "specrepro-vllm-0.32.0",
            "specrepro-sglang"} <= set(named_in_commands())
    assert {"specrepro", "specrepro-vllm-0.26"} <= set(named_in_text())
    assert TEXT_NAME.search("conda activate specrepro-vllm").group(1) == "specrepro-vllm"


def test_every_named_environment_is_created_by_a_file():
    have = created()
    missing = {name: sorted(where) for source in (named_in_commands(), named_in_text())
               for name, where in source.items() if name not in have}
    assert missing == {}, f"named but created by no environment*.yml (have {sorted(have)})"


def test_each_vllm_environment_pins_the_torch_its_release_declares():
    # vLLM's wheels pin torch exactly (METADATA Requires-Dist); an environment that lets pip
    # resolve another build is not the engine the profile names
    pins = {"0.26.0": "2.11.0", "0.27.1": "2.13.0", "0.28.0": "2.13.0", "0.32.0": "2.13.0",
            "0.33.0": "2.14.0"}
    seen = set()
    for path in ROOT.glob("environment*.yml"):
        deps = yaml.safe_load(path.read_text())["dependencies"]
        pip = next((d["pip"] for d in deps if isinstance(d, dict) and "pip" in d), [])
        vllm = [p.split("==")[1] for p in pip if p.startswith("vllm==")]
        if vllm:
            assert f"torch=={pins[vllm[0]]}" in pip, path.name
            seen.add(vllm[0])
    assert seen == set(pins)
