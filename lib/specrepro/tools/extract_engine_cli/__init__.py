"""The flag extractor: the lists of command-line flags vLLM and SGLang accept, generated
from their wheels.

Its output is runtime data and lives where the runtime reads it:
`lib/specrepro/harness/engine_cli/<engine>-<version>.json` (and `.parser.json`), read by
`harness/flags.py` (`engine_cli`, `engine_cli_versions`), which validates every profile's
flags against them. The harness never imports this package; it is tooling
(`specrepro.tools`), run by `scripts/extract_engine_cli.py` when an engine version changes.
The name is the script's: it extracts an engine's command-line interface.

Design: the extractor reads each wheel's source statically (wheel.py), walks the
engine's flag registration as its parser would (vllm.py with vllm_kwargs.py, sglang.py)
into a `registry.Registry`, and writes the list (extract.py); parser_dump.py compares a
list with an installed engine's own parser. The lists are its output, never typed by hand.
Imports the standard library only (the engines are never imported).
"""
