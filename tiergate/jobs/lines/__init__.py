"""OpenAI's Batch API on the jobs pipeline: a batch's lines in chunks on Kafka, each chunk's
answers written once to object storage, the output and error files made from them."""
