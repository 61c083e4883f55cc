"""The GPU harness: `python -m benchmarks.gpu STEP... --run-dir DIR` (its manual:
benchmarks/gpu/__main__.py)."""
