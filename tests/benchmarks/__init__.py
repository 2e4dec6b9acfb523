"""The benchmark scripts and their harness as CPU smoke runs."""
