"""Speculative-decoding configuration for a tier's vLLM engine."""
