"""How the live stack prompts a generator tier: one definition for every path that measures its answers (R27).

Live, a prompt reaches Level-1 through two services. The probe ranks its directions and forwards the
best ``ProbeSettings.forward_directions`` of them (``ProbeResult.forwarded``, called by
``svc_probe.worker.forward``); the generator fills every sampling field the request leaves unset from
its tier's defaults, rollout dropout included (``GeneratorSettings(tier=...).sampling_defaults()``),
and renders the prompt with the model's ``PromptFormat`` (chat template or the zoo's plain text). The
training driver sends no sampling fields, so those defaults are what rollouts are sampled with.

A calibration, a bench or an evaluation that measures a tier's answers builds its requests with
:class:`LivePrompting` from those same settings objects and generates with the generator's own backend
(:func:`generate_answers`), so the next change of the live prompt moves every measurement with it.
``tests/svc_generator/test_live_prompting.py`` pins the live and measuring paths to the same token ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from strata.sampling import Sampling

if TYPE_CHECKING:  # torch and the generator's backend: loaded only by the paths that generate
    from svc_generator.backends.base import GenerationOutput, GenerationRequest
    from svc_generator.backends.hf import HfBackend
    from svc_probe.core import ProbeResult


@dataclass(frozen=True)
class LivePrompting:
    """What a tier's generator is given live for a prompt, apart from the prompt itself."""

    tier: Literal[1, 2]
    forward_directions: int      # the probe's best directions the generator sees (its Directions: line)
    sampling: Sampling           # the tier's sampling defaults (seed unset); rollout dropout as served
    max_batch_size: int          # the generator's batch: what a measuring path batches by

    @classmethod
    def live(cls, tier: Literal[1, 2] = 1) -> LivePrompting:
        """From the services' own settings (defaults and ``STRATA_*`` environment), as a deployment reads them."""
        from svc_generator.config import GeneratorSettings
        from svc_probe.config import ProbeSettings

        generator = GeneratorSettings(tier=tier)
        return cls(tier, ProbeSettings().forward_directions, generator.sampling_defaults(),
                   generator.max_batch_size)

    def directions(self, probed: ProbeResult) -> tuple[str, ...]:
        """The directions the generator sees for a prompt the probe judged ``probed``."""
        return probed.forwarded(self.forward_directions)

    def request(self, prompt: str, directions: Sequence[str], seed: int | None) -> GenerationRequest:
        """The generator's request for ``prompt`` with the ``directions`` forwarded to it (:meth:`directions`),
        as the live worker builds it from the probe's event."""
        from svc_generator.backends.base import GenerationRequest

        return GenerationRequest(prompt, tuple(directions), replace(self.sampling, seed=seed))

    def key(self) -> dict[str, Any]:
        """What decides the answers (for a cache key or a report): directions forwarded and sampling."""
        return {"tier": self.tier, "forward_directions": self.forward_directions,
                **{k: v for k, v in asdict(self.sampling).items() if k != "seed"}}


def probe_prompts(probe_dir: str | Path, prompts: Sequence[str]) -> list[ProbeResult]:
    """The probe's results for ``prompts`` from the model in ``probe_dir``, under the live probe's settings
    (rules and prompt length, ``STRATA_*`` environment included): what the probe worker would decide."""
    from strata.models.loading import load_causal_lm
    from svc_probe.config import ProbeSettings
    from svc_probe.core import ProbeRules, probe

    settings = ProbeSettings()
    return probe(load_causal_lm(probe_dir, device="cpu"), list(prompts), ProbeRules.of(settings),
                 settings.max_prompt_tokens)


def generate_answers(backend: HfBackend, prompting: LivePrompting, prompts: Sequence[str],
                     directions: Sequence[Sequence[str]], seed: int) -> list[GenerationOutput]:
    """Answers to ``prompts``, each with its forwarded ``directions`` (:meth:`LivePrompting.directions`), from
    the generator's own backend, sampled as live, in the generator's batches.

    Batch ``i`` is seeded ``seed + i``, so a rerun on the same code and machine samples the same answers.
    """
    if len(prompts) != len(directions):
        raise ValueError(f"one directions entry per prompt: {len(prompts)} prompts, {len(directions)} entries")
    size = prompting.max_batch_size
    outputs: list[GenerationOutput] = []
    for batch, start in enumerate(range(0, len(prompts), size)):
        requests = [prompting.request(prompt, forwarded, seed + batch) for prompt, forwarded
                    in zip(prompts[start:start + size], directions[start:start + size], strict=True)]
        outputs += backend.generate(requests)
    return outputs
