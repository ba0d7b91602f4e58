"""Engines: vLLM command lines, launching, warm-up and the parity gate at launch.

Offline tooling and the local stack use this package; the request path (``backends``,
``gateway``) never imports it.
"""
