"""The jobs benchmarks: a fleet of workers churned under a backlog (``tiergate bench jobs``),
rollout batches over task domains (``bench jobs-batch``), keys sharing the fleet
(``bench share``), and the stack, fleet and figures they share."""
