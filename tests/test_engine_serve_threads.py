"""serve.py's --threads: one torch thread on the CPU unless told otherwise."""

import pytest

from specrepro.embedded.serve import build_parser, engine_threads


@pytest.mark.parametrize("flags, want", [
    ([], 1), (["--device", "cuda"], None), (["--threads", "2"], 2),
    (["--device", "cuda", "--threads", "4"], 4)])
def test_engine_threads(flags, want):
    assert engine_threads(build_parser().parse_args(["--model", "m", *flags])) == want


def test_engine_threads_rejects_zero():
    with pytest.raises(ValueError, match="--threads"):
        engine_threads(build_parser().parse_args(["--model", "m", "--threads", "0"]))
