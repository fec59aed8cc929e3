"""The serving runtime: run a plan's tasks as batching frontends over worker processes,
each worker one model instance bound to its segment (CPU cores, a MIG device, an MPS share)."""
