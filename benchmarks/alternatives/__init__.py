"""What users would write instead of scehr's service, for benchmarks/compare_servers.py."""
