"""Agent jobs: their state in object storage (:mod:`.state`), a worker's runs (:mod:`.run`)
and rollout batches (:mod:`.batches`). The transport they travel on is :mod:`tiergate.queue`."""
