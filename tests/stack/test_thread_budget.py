"""``strata up``'s services share the CPU's cores instead of each taking all of them (torch's default)."""

from __future__ import annotations

import pytest

from strata_tools.stack.spec import default_services, thread_env


@pytest.mark.parametrize(("cores", "threads"), [(1, "1"), (2, "1"), (8, "2"), (16, "4"), (18, "4")])
def test_the_cores_are_shared_among_the_services_that_work_at_once(cores: int, threads: str) -> None:
    for spec in default_services(environ={}, cores=cores):
        assert (spec.env["OMP_NUM_THREADS"], spec.env["MKL_NUM_THREADS"]) == (threads, threads), spec.name


@pytest.mark.parametrize("variable", ["OMP_NUM_THREADS", "MKL_NUM_THREADS"])
def test_threads_the_environment_sets_are_left_to_it(variable: str) -> None:
    assert thread_env({variable: "3"}, cores=16) == {}
    for spec in default_services(environ={variable: "3"}, cores=16):
        assert "OMP_NUM_THREADS" not in spec.env and "MKL_NUM_THREADS" not in spec.env, spec.name
