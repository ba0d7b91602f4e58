"""The jobs' transport on Kafka: the pipeline, a worker's consumer, its membership in the
fleet, committed offsets and the lag it reports. What runs a job lives in
:mod:`tiergate.jobs`."""
