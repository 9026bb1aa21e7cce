"""svc_learner: PPO on reward-scored rollouts, weight sync to the generators (R13, R17)."""
