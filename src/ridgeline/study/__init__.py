"""The validation study: a bank of simulated servers with known capacities, probed again
and again to measure how far a probe's estimate can be trusted (``ridgeline study``)."""
