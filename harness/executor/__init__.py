"""Plans and fill patterns for the executor's tests and benchmarks."""
