"""Capacity probing: connect check → warmup → search → confirm → stop."""
