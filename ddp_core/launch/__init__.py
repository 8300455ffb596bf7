"""Launching runs: from a profile to a checked plan, then torchrun on this machine or a Slurm job."""
