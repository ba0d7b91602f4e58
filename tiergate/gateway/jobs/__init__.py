"""The jobs API's routes: ``/v1/jobs``, uploads, rollout batches and event streams."""
