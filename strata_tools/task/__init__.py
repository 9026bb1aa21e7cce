"""The synthetic RLHF task: the prompt suite with its splits, the oracle, the corpora, the simulated desk."""
