"""`python -m benchmarks.gpu.sim_trace RUN_DIR` (benchmarks/gpu/sim_trace/cli.py)."""

import sys

from benchmarks.gpu.sim_trace.cli import main

sys.exit(main())
