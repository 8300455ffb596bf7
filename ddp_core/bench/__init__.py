"""Benchmarks of communication, run under torchrun."""
