"""`python -m specrepro.embedded.training`: the same command as `specrepro train`."""

from specrepro.embedded.training.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
