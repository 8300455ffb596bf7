"""The training engine: configuration, runtime placement, model, data, timers and run files."""
