"""Benchmarks of the monitor: throughput, abort latency and memory (see docs/performance.md).

Run them all with `python -m bench.run`; nothing here is part of the test suite.
"""
