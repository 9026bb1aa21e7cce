"""What one request may ask, agreed by the door (the scheduler) and the tiers that serve it.

A request the scheduler accepts must be served, never refused further down (R16's sampling bounds
included), so the defaults of ``SchedulerSettings``, ``GeneratorSettings`` and ``SamplingBounds``
all come from here; ``tests/strata/test_request_contract.py`` walks the limits of both sides. A
deployment that raises a tier's limit raises the scheduler's with it.
"""

from __future__ import annotations

MIN_TEMPERATURE = 0.3  # exclusive (R16): lower collapses rollouts into repetition
MAX_TEMPERATURE = 2.0  # inclusive
MAX_TOP_P = 0.95  # exclusive (R16)
MAX_NEW_TOKENS = 512  # largest max_new_tokens a request may ask (and the model must have the positions)
DEFAULT_MAX_NEW_TOKENS = 64  # what a request that does not say gets
MAX_PROMPT_CHARS = 8000  # longest prompt, in characters
MAX_N_SAMPLES = 16  # most rollouts one request may ask
