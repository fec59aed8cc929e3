"""From a measured capacity to replicas and GPUs, and the registry of measured models."""

from ridgeline.sizing.allocator import (
    Allocation,
    AllocationInputs,
    NaiveAllocation,
    NaiveRule,
    Savings,
    allocate,
    naive_rule,
)
from ridgeline.sizing.registry import (
    CapacityResult,
    Registry,
    RegistryEntry,
    artifact_digest,
)

__all__ = [
    "Allocation",
    "AllocationInputs",
    "CapacityResult",
    "NaiveAllocation",
    "NaiveRule",
    "Registry",
    "RegistryEntry",
    "Savings",
    "allocate",
    "artifact_digest",
    "naive_rule",
]
