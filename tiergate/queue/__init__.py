"""Agent jobs on Kafka with results in S3 (issue 4); nothing is implemented here yet."""
