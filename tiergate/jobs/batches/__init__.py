"""Rollout batches (issue 25): many tasks across domains, several samples each, run as
ordinary jobs of the batch's owner. The gateway records a batch (:mod:`.store`); a worker
holding the batch's lease schedules its jobs (:mod:`.schedule`, :mod:`.driver`), and
rewards are normalized where they are compared (:mod:`.rewards`); :mod:`.export` writes
the rollouts as a trainer reads them."""
