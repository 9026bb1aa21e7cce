"""``python -m strata_tools.bench.scheduler``: the bench without the ``strata`` command."""

from strata_tools.bench.scheduler import main

if __name__ == "__main__":
    raise SystemExit(main())
