"""Benchmarks, one module per ``strata bench <name>`` (registered in ``strata_tools.cli.bench_cmd``).

Each module exposes ``add_arguments(parser)`` and ``run(args) -> int``, measures on this machine in
one run, prints a readable table and ends with one machine-readable line ``<name> key=value``.
"""
