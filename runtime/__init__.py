"""bubblescope.runtime: runs lowered schedules on torch.distributed point-to-point."""
