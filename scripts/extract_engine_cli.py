"""Generate the lists of command-line flags vLLM and SGLang accept, from their wheels.

    python scripts/extract_engine_cli.py [WHEEL ...] [--wheel-dir .cache/wheels] [--download]
                                         [--out DIR]
    python scripts/extract_engine_cli.py --dump-parser vllm|sglang > parser.json
    python scripts/extract_engine_cli.py --compare-parser parser.json engine_cli/vllm-0.26.0.json

The extractor is library code, `specrepro.tools.extract_engine_cli` (its rules and their tests:
tests/test_extract_engine_cli.py); this is its command line.
"""

from __future__ import annotations

import sys

from specrepro.tools.extract_engine_cli.extract import main

if __name__ == "__main__":
    sys.exit(main())
