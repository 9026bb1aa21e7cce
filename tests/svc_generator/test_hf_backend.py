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


def test_each_token_carries_its_log_probability_under_the_models_own_distribution(zoo) -> None:
    """Recomputed by one forward pass over prompt + response: the log-softmax of the model's logits, not
    of the sampling distribution (temperature 0.8 here); no dropout, so the same weights saw both."""
    import torch

    backend = HfBackend(str(zoo.level1), "cpu")
    sampling = Sampling(temperature=0.8, top_p=1.0, max_new_tokens=12, seed=3, rollout_dropout=0.0)
    prompts = ["Explain recursion.", "How do tides work? Please keep it short and clear."]
    # One request per batch: no left padding, so one plain forward pass sees what generation saw.
    outputs = [backend.generate([GenerationRequest(p, ("explain_principle",), sampling)])[0] for p in prompts]
    lm = backend.lm
    for prompt, output in zip(prompts, outputs, strict=True):
        assert len(output.logprobs) == len(output.token_ids) > 0
        text = backend.prompt_format.generator_text(prompt, ("explain_principle",))
        prompt_ids = backend.prompt_format.encode([text], return_tensors="pt")["input_ids"][0].tolist()
        ids = torch.tensor([prompt_ids + list(output.token_ids)])
        with torch.no_grad():
            logits = lm.model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()
        expected = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(output.token_ids)[:, None])[:, 0]
        assert torch.allclose(torch.tensor(output.logprobs), expected, atol=1e-3)
        assert all(lp <= 0 for lp in output.logprobs)
