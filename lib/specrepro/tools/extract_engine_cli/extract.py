"""Generate the lists of command-line flags vLLM and SGLang accept, from their wheels.

    python scripts/extract_engine_cli.py [WHEEL ...] [--wheel-dir .cache/wheels] [--download]
                                         [--out DIR]
    python scripts/extract_engine_cli.py --dump-parser vllm|sglang > parser.json
    python scripts/extract_engine_cli.py --compare-parser parser.json engine_cli/vllm-0.26.0.json

Reads each wheel's source with `ast`; the packages are never imported (they need a CUDA
torch and a GPU). With WHEEL arguments it extracts those wheels (engine and version from the
file name); without, every pinned version (`PINNED`) whose wheel is in `--wheel-dir`
(`--download` fetches the missing ones with `pip download --no-deps`). Writes
`lib/specrepro/harness/engine_cli/<engine>-<version>.json` (the runtime's data folder, `OUT`),
which the engine adapters validate every profile against (`specrepro.harness.flags` reads
them). The lists are this script's output, never typed by hand: regenerate them when an
engine version changes.

`--dump-parser` runs where the engine is installed: it builds the engine's own parser and
writes its option strings; `--compare-parser` diffs such a dump with a generated list (the
ground truth for the rules in vllm.py, vllm_kwargs.py and sglang.py).

Design: `extract` reads one wheel (engine and version from its file name) with that
engine's extractor (`EXTRACTORS`); `main` is the command line `scripts/extract_engine_cli.py`
runs (`ROOT`: the checkout this package is installed from, editable, for the defaults).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from specrepro.tools.extract_engine_cli.parser_dump import compare_parser, dump_parser
from specrepro.tools.extract_engine_cli.sglang import extract_sglang
from specrepro.tools.extract_engine_cli.vllm import extract_vllm
from specrepro.tools.extract_engine_cli.wheel import ExtractError, Wheel, sha256

# the checkout: lib/specrepro/tools/extract_engine_cli/extract.py -> the repository root
ROOT = Path(__file__).resolve().parents[4]
# where the lists go: the harness's data folder, read by harness/flags.py (this package,
# tooling, is never imported by the harness)
OUT = "lib/specrepro/harness/engine_cli"
# The versions whose lists are committed; run without WHEEL arguments, the script
# regenerates each one whose wheel is in --wheel-dir.
PINNED = {"vllm": ["0.26.0", "0.33.0"], "sglang": ["0.5.14", "0.5.23"]}


def wheel_identity(path: Path) -> tuple[str, str]:
    """(engine, version) from a wheel's file name: `vllm-0.26.0-cp38-abi3-….whl`."""
    parts = path.name.split("-")
    if len(parts) < 3 or parts[0] not in PINNED:
        raise ExtractError(f"{path.name}: not a vllm or sglang wheel "
                           "(expected <engine>-<version>-<tags>.whl)")
    return parts[0], parts[1]


def fetch_wheel(engine: str, version: str, wheel_dir: Path, download: bool) -> Path | None:
    """The engine's wheel from the cache; downloaded there first if missing and asked to."""
    pattern = f"{engine}-{version}-*.whl"
    found = sorted(wheel_dir.glob(pattern))
    if not found and download:
        wheel_dir.mkdir(parents=True, exist_ok=True)
        # The SGLang wheel holds cpython-311 extensions; name the target so the
        # download works from any interpreter. pip does not widen a `manylinux_2_X`
        # platform to older glibc tags, so name vLLM's (manylinux_2_28) as well as
        # SGLang's (manylinux_2_34).
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--python-version", "3.11", "--platform", "manylinux_2_34_x86_64",
               "--platform", "manylinux_2_28_x86_64",
               "-d", str(wheel_dir), f"{engine}=={version}"]
        subprocess.run(cmd, check=True)
        found = sorted(wheel_dir.glob(pattern))
    return found[0] if found else None


EXTRACTORS = {"vllm": extract_vllm, "sglang": extract_sglang}


def extract(wheel_path: Path) -> dict:
    engine, version = wheel_identity(wheel_path)
    wheel = Wheel(wheel_path)
    data = {
        "engine": engine,
        "version": version,
        "wheel": wheel_path.name,
        "wheel_sha256": sha256(wheel_path),
        "generated_by": "scripts/extract_engine_cli.py",
        **EXTRACTORS[engine](wheel),
    }
    data["sources"] = sorted(wheel.read)
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheels", nargs="*", type=Path, help="wheels to extract (default: the "
                        "pinned versions found in --wheel-dir)")
    parser.add_argument("--wheel-dir", type=Path, default=ROOT / ".cache" / "wheels")
    parser.add_argument("--download", action="store_true",
                        help="pip download the pinned wheels missing from --wheel-dir")
    parser.add_argument("--out", type=Path, default=ROOT / OUT)
    parser.add_argument("--dump-parser", choices=sorted(EXTRACTORS),
                        help="print the installed engine's own parser's options as JSON")
    parser.add_argument("--compare-parser", nargs=2, type=Path, metavar=("DUMP", "LIST"),
                        help="compare a --dump-parser output with a generated list")
    args = parser.parse_args(argv)
    if args.dump_parser:
        print(json.dumps(dump_parser(args.dump_parser), indent=1))
        return 0
    if args.compare_parser:
        dump, listed = (json.loads(p.read_text()) for p in args.compare_parser)
        diff = compare_parser(dump, listed)
        print(json.dumps(diff, indent=1))
        return 1 if diff["missing"] or diff["extra"] else 0

    wheels = list(args.wheels)
    if not wheels:
        for engine, versions in PINNED.items():
            for version in versions:
                found = fetch_wheel(engine, version, args.wheel_dir, args.download)
                if found is None:
                    print(f"{engine} {version}: no {engine}-{version}-*.whl in {args.wheel_dir} "
                          "(--download fetches it); its list is left as it is", file=sys.stderr)
                else:
                    wheels.append(found)
        if not wheels:
            raise SystemExit(f"no pinned wheel in {args.wheel_dir}")
    args.out.mkdir(parents=True, exist_ok=True)
    for wheel_path in wheels:
        try:
            data = extract(wheel_path)
        except ExtractError as err:
            raise SystemExit(f"extract_engine_cli: {err}") from None
        out = args.out / f"{data['engine']}-{data['version']}.json"
        out.write_text(json.dumps(data, indent=1) + "\n")
        print(f"{out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}: "
              f"{len(data['flags'])} flags")
    return 0


if __name__ == "__main__":
    sys.exit(main())
