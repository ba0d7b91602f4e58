"""tiergate: an OpenAI-compatible gateway over a standard and a fast tier of vLLM."""

__version__ = "0.1.0"
