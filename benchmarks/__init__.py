"""Benchmarks of specctl; `benchmarks.gpu` is the GPU end-to-end harness."""
