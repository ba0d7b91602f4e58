"""tiergate bench soak: every surface at once, faults on a schedule, a checked history."""
