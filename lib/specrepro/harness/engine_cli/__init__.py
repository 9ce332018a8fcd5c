"""The lists of command-line flags vLLM and SGLang accept, generated from their wheels
(`<engine>-<version>.json` beside these modules, read by harness/flags.py), and the
extractor that writes them.

Design: the extractor reads each wheel's source statically (wheel.py), walks the
engine's flag registration as its parser would (vllm.py with vllm_kwargs.py, sglang.py)
into a `registry.Registry`, and writes the list (extract.py, run by
`scripts/extract_engine_cli.py`); parser_dump.py compares a list with an installed
engine's own parser. The lists are its output, never typed by hand.
"""
