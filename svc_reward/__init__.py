"""svc_reward: light RM on the hot path, strong RM for Level-2, ensembles (R2, R3, R5-R8)."""
