"""The job pipeline's servers for one machine: a durable S3 API server (SeaweedFS) and a
Kafka-protocol broker (Tansu) that keeps its log in that object store."""
