"""The HF backend on the zoo's Level-1 model: one batch may mix sampling configurations."""

from __future__ import annotations

from strata.sampling import Sampling
from svc_generator.backends.base import GenerationRequest
from svc_generator.backends.hf import HfBackend


def test_a_batch_mixing_seeded_and_unseeded_requests_generates_each(zoo) -> None:
    backend = HfBackend(str(zoo.level1), "cpu")
    unseeded = Sampling(temperature=0.8, top_p=0.9, max_new_tokens=8)
    seeded = Sampling(temperature=0.8, top_p=0.9, max_new_tokens=8, seed=7)
    requests = [GenerationRequest("Explain recursion.", ("explain_principle",), s)
                for s in (unseeded, seeded, unseeded, seeded)]
    outputs = backend.generate(requests)  # Kafka rollouts (no seed) and an evaluation (seeded) together
    assert len(outputs) == 4 and all(0 < len(o.token_ids) <= 8 for o in outputs)
    alone = [backend.generate([requests[1]])[0].token_ids for _ in range(2)]
    assert alone[0] == alone[1]  # a seeded request alone is reproducible (what strata train's evaluation relies on)
