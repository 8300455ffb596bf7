"""ddp_core: the model, the DDP training loop and the timers behind the report."""
