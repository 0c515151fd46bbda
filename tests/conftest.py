"""Shared test setup: headless matplotlib, one thread per process."""

import os

os.environ.setdefault("MPLBACKEND", "Agg")
