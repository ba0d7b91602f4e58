"""The urgency benchmark (``tiergate bench urgency``): interactive requests beside a
backlog of patient ones, with and without engine priorities."""
