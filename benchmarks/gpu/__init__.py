"""The GPU end-to-end harness (`python -m benchmarks.gpu.harness`): docs/sglang.md."""
