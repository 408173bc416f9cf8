"""forkv benchmarks."""
