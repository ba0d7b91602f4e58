"""A worker and its runs: pickup, the runner, the agent loop in the job's sandbox, replays
and what a worker reports of itself."""
