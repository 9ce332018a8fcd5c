"""`python -m specrepro.tools.training`: the same command as `specrepro train`."""

from specrepro.tools.training.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
