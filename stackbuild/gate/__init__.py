"""The throughput gate: workload, load generator, statistics, probes, verdict."""
