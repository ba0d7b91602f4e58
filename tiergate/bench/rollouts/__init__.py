"""``tiergate bench rollouts``: a heavy-tailed rollout batch with the round barrier and
without, on one stack in one run."""
