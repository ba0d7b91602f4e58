"""The HTTP face: OpenAI endpoints, tier selection, retries and fallback, metrics."""
