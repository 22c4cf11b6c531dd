"""Benchmarks with their baselines. Run ``make bench`` (or ``python -m bench voicy``)."""
