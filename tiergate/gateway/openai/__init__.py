"""The OpenAI proxy path: the routes, a request's selection of backends, the upstream call,
retries and fallback, assembling and streaming answers."""
