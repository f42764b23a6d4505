"""graphfeed.testing: helpers for running a local graphfeed cluster (tests, demo, benchmarks)."""
