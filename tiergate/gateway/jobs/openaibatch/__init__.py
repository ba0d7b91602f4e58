"""OpenAI's Batch API over the jobs pipeline: the routes (routes), their work (api) and the
input file's check and plan (inputfile)."""
