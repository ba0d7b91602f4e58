"""Who may call and how much: API keys, the gatekeeper, the tier policy, admission and limits."""
