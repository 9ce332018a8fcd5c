"""specrepro: reproducible notebooks for speculative decoding in LLM serving.

See docs/architecture.md for the module map and the contracts between parts.
"""

__version__ = "0.1.0"
