"""Producing checkpoints: the embedded model's import, and (issue 3) INT8/INT4 parity."""
