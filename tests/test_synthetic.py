"""The one latency model's schema: every user (fake server, runtime backend, plan) shares
its fields and bounds."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from ridgeline.pipeline.plan import SyntheticModel
from ridgeline.serve.backends import SyntheticBackendConfig
from ridgeline.synthetic.model import BatchCost, LatencyModel

SCHEMAS: list[tuple[type[BaseModel], dict[str, Any]]] = [
    (LatencyModel, {}),
    (SyntheticBackendConfig, {}),
    (SyntheticModel, {"base_ms": 1.0, "per_item_ms": 0.5}),
]


@pytest.mark.parametrize(("schema", "required"), SCHEMAS)
def test_every_synthetic_schema_is_the_shared_one(
    schema: type[BaseModel], required: dict[str, Any]
) -> None:
    assert issubclass(schema, BatchCost)
    widest = BatchCost.model_fields["noise_cv"].metadata
    assert schema.model_fields["noise_cv"].metadata == widest
    assert schema.model_validate({**required, "noise_cv": 10.0})
    with pytest.raises(ValidationError, match="noise_cv"):
        schema.model_validate({**required, "noise_cv": 10.5})
    with pytest.raises(ValidationError, match="must start with -1"):
        schema.model_validate({**required, "inputs": [{"name": "X", "shape": [2, 4]}]})
    with pytest.raises(ValidationError, match="valid tensor datatypes"):
        schema.model_validate({**required, "outputs": [{"name": "Y", "datatype": "FP8"}]})


def test_a_plan_still_requires_its_batch_cost() -> None:
    with pytest.raises(ValidationError, match="base_ms"):
        SyntheticModel.model_validate({"per_item_ms": 1.0})
