"""Port blocks for multi-node infrastructure: outside the kernel's ephemeral range, never overlapping."""

from __future__ import annotations

from strata_tools.infra.process import ephemeral_port_range, free_port_block


def test_blocks_lie_below_the_ephemeral_range_and_do_not_overlap() -> None:
    low, _ = ephemeral_port_range()
    blocks = [set(range(base, base + 6)) for base in (free_port_block(6) for _ in range(20))]
    assert all(max(block) < low for block in blocks)
    taken: set[int] = set()
    for block in blocks:
        assert not block & taken
        taken |= block

