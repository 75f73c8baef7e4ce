"""Benchmarks: `mrcctl bench SCENARIO` (runner.py), one module per scenario."""
from .runner import SCENARIOS, run_scenario  # noqa: F401
