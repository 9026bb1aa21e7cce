"""The backend interface: a batch of requests in, one output per request out. No I/O, no queues."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from strata.sampling import Sampling


@dataclass(frozen=True)
class GenerationRequest:
    prompt: str                       # raw prompt text (the backend applies the template)
    directions: tuple[str, ...]       # probe's directions, first = main; may be empty
    sampling: Sampling


@dataclass(frozen=True)
class GenerationOutput:
    text: str                         # the response, without prompt and EOS
    token_ids: tuple[int, ...]        # response token ids as generated (EOS included when it came)
    prompt_tokens: int                # tokens of the templated prompt
    finished: bool                    # stopped by EOS rather than by max_new_tokens
    # Each response token's log-probability under the model's own distribution (its logits before
    # temperature and top-p), one per token id; empty where the backend does not report them.
    logprobs: tuple[float, ...] = ()


class Backend(Protocol):
    model_id: str                     # what produced the rollouts (path or name + weights version)
    tokenizer_id: str                 # key of the token ids in the content store
    n_params: int                     # parameters of the model (the ledger's params x tokens)
    device: str                       # where it runs: cpu, cuda:0, ... (picks the device-seconds clock)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationOutput]:
        """Generate one output per request, in order. Requests may mix sampling parameters."""
        ...

    def load_weights(self, path: str) -> None:
        """Swap in new weights (same architecture and tokenizer) between batches."""
        ...

    def release_memory(self) -> None:
        """Give cached device memory back after a batch."""
        ...
