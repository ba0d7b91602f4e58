"""The fairness benchmark (``tiergate bench fairness``): a tenant that floods beside one
that sends a request at a time, through gateways with keys in front of running engines."""
