"""Compound inference pipelines: the plan that runs (``plan``)."""
