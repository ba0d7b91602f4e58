"""Endpoint pools per tier: discovery, health, load signals, routing, and vLLM launch."""
