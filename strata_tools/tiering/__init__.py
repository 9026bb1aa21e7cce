"""The tiers measured end to end, shared by `strata bench tiers`, the demo and the benches that run the
live services (edge, scheduler --live): the live arms (``arms``), a run's answers and costs per prompt
(``answers``), the replayed routers and the headline (``headline``, ``tier_eval``), and the report's lines
(``lines``). Nothing here parses a bench's flags or prints a bench's last line."""
