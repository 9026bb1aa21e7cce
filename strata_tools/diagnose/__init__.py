"""The article's troubleshooting table (seed §5.1, R16) as checks that say PASS or ALARM.

One module per failure mode, each pure (no gRPC, Kafka or Redis): a frozen config holding the
decision rule's thresholds, the measurement's arithmetic, and ``evaluate`` turning a measurement into
a :class:`~strata_tools.diagnose.verdict.CheckResult` with the number and the article's cure.

============  ==========================================  =====================================
check         measurement                                 alarm (default)
============  ==========================================  =====================================
rm-noise      mean per-item std of repeated scores        spread > 0.1 (0-5 scale)
shift         mean log-prob of recent rollouts under the   mean < -150
              current policy (summed over the response)
rm-overfit    Spearman of the RM vs the oracle / strong    rho < 0.7
              RM on fresh prompts
memory        device memory (CUDA, else RSS) per rollout   growth > 16 MiB per round
              round of a generator
repetition    share of duplicate responses to one prompt   share > 0.4
============  ==========================================  =====================================

``strata_tools.diagnose.sources`` talks to the live services (the edge), ``strata_tools.diagnose.runner`` wires
both and renders the table; ``strata diagnose`` is the command.
"""

from strata_tools.diagnose.verdict import CheckResult, Verdict

__all__ = ["CheckResult", "Verdict"]
