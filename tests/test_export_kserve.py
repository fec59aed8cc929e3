"""``ridgeline export kserve``: a plan as InferenceServices and its MIG layout's ConfigMap,
read back with the ``kubernetes`` client's models."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from _cli import ridgeline
from ridgeline.errors import PlanError
from ridgeline.export.kserve import check_service, export_kserve
from ridgeline.pipeline.plan import Plan

kubernetes = pytest.importorskip("kubernetes")
EXAMPLE = Path(__file__).parents[1] / "examples" / "plans" / "traffic-cpu.yaml"


def mig_plan() -> Plan:
    """A 3g.40gb task (2 instances), an MPS half of a 1g.10gb slice (3) and a CPU task."""
    synthetic = {"base_ms": 1, "per_item_ms": 0.5}
    gpu = {"gpu": "A100-80GB"}
    return Plan.model_validate(
        {
            "name": "Traffic_MIG",
            "slo_ms": 300,
            "tasks": {
                "detect": {
                    "variant": "a",
                    "synthetic": synthetic,
                    "segment": {"kind": "mig", "profile": "3g.40gb", **gpu},
                    "batch_size": 8,
                    "instances": 2,
                    "latency_budget_ms": 120,
                },
                "classify": {
                    "variant": "b",
                    "synthetic": synthetic,
                    "segment": {"kind": "mps", "profile": "1g.10gb", "share": 0.5, **gpu},
                    "batch_size": 16,
                    "instances": 3,
                    "latency_budget_ms": 150,
                },
                "tail": {
                    "variant": "c",
                    "synthetic": synthetic,
                    "segment": {"kind": "cpu", "cores": 2},
                    "instances": 1,
                    "latency_budget_ms": 100,
                },
            },
            "edges": [{"source": "detect", "target": "classify", "factor": 2}],
        }
    )


def read(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    return doc


def test_a_mig_plan_becomes_services_on_mig_resources_and_its_layout(tmp_path: Path) -> None:
    from kubernetes import client

    written = export_kserve(mig_plan(), tmp_path, storage_uri="s3://models/traffic")
    assert [p.name for p in written] == [
        "mig-parted-config.configmap.yaml",
        "detect.yaml",
        "classify.yaml",
        "tail.yaml",
    ]
    api = client.ApiClient()
    services = {p.stem: read(p) for p in written[1:]}
    for name, doc in services.items():
        assert (
            doc["apiVersion"] == "serving.kserve.io/v1beta1" and doc["kind"] == "InferenceService"
        )
        meta = client.V1ObjectMeta(**doc["metadata"])
        assert meta.name == f"traffic-mig-{name}" and meta.namespace == "default"
        model = doc["spec"]["predictor"]["model"]
        assert model["modelFormat"] == {"name": "triton"} and model["protocolVersion"] == "v2"
        assert model["storageUri"] == "s3://models/traffic"
        assert f"--load-model={name}" in model["args"]
        res = client.V1ResourceRequirements(**model["resources"])
        assert res.requests == res.limits
    replicas = {
        n: (d["spec"]["predictor"]["minReplicas"], d["spec"]["predictor"]["maxReplicas"])
        for n, d in services.items()
    }
    assert replicas == {"detect": (2, 2), "classify": (3, 3), "tail": (1, 1)}
    limits = {
        n: d["spec"]["predictor"]["model"]["resources"]["limits"] for n, d in services.items()
    }
    assert limits == {
        "detect": {"nvidia.com/mig-3g.40gb": "1"},
        "classify": {"nvidia.com/mig-1g.10gb": "1"},
        "tail": {"cpu": "2"},
    }
    env = services["classify"]["spec"]["predictor"]["model"]["env"]
    assert env == [{"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": "50"}]
    selectors = {n: d["spec"]["predictor"].get("nodeSelector") for n, d in services.items()}
    assert selectors == {
        "detect": {"nvidia.com/mig.config": "traffic-mig"},
        "classify": {"nvidia.com/mig.config": "traffic-mig"},
        "tail": None,
    }

    config_map = read(written[0])
    cm = client.V1ConfigMap(**{k: v for k, v in config_map.items() if k != "apiVersion"})
    assert cm.kind == "ConfigMap" and config_map["metadata"]["namespace"] == "gpu-operator"
    layout = yaml.safe_load(config_map["data"]["config.yaml"])
    # 2 x 3g.40gb and 3 MPS halves packed into 2 x 1g.10gb, on two A100s
    devices = layout["mig-configs"]["traffic-mig"]
    assert sum(d["mig-devices"].get("3g.40gb", 0) for d in devices) == 2
    assert sum(d["mig-devices"].get("1g.10gb", 0) for d in devices) == 2
    assert "kubectl label node NODE nvidia.com/mig.config=traffic-mig" in written[0].read_text()
    assert api.sanitize_for_serialization(cm)["data"] == config_map["data"]


def test_the_kubernetes_models_refuse_a_wrong_field_or_unequal_extended_resources() -> None:
    from kubernetes import client

    doc = yaml.safe_load(
        """
        metadata: {name: x, namespace: default}
        spec:
          predictor:
            minReplicas: 1
            maxReplicas: 1
            model:
              args: []
              resources:
                requests: {nvidia.com/mig-1g.10gb: "1"}
                limits: {nvidia.com/mig-1g.10gb: "2"}
        """
    )
    with pytest.raises(PlanError, match="requests = limits"):
        check_service(client, doc)
    doc["spec"]["predictor"]["model"]["resources"] = {
        "requests": {"cpu": "1"},
        "limit": {"cpu": "1"},
    }
    with pytest.raises(PlanError, match=r"V1PodSpec it reads back .*'limit'"):
        check_service(client, doc)
    doc["spec"]["predictor"]["model"]["resources"] = {
        "requests": {"cpu": "1"},
        "limits": {"cpu": "1"},
    }
    doc["spec"]["predictor"]["nodeSelector"] = {"nvidia.com/mig.config": 3}
    with pytest.raises(PlanError, match=r"spec\.predictor: .*V1PodSpec"):
        check_service(client, doc)


def test_the_cli_writes_the_manifests_and_refuses_bad_inputs(tmp_path: Path) -> None:
    out = tmp_path / "k8s"
    res = ridgeline(
        "export",
        "kserve",
        str(EXAMPLE),
        "--out",
        str(out),
        "--storage-uri",
        "gs://b/traffic",
        "--namespace",
        "serving",
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[:3] == [
        str(out / f"{t}.yaml") for t in ("detect", "car", "face")
    ]
    detect = read(out / "detect.yaml")
    assert detect["metadata"]["namespace"] == "serving"
    assert detect["spec"]["predictor"]["model"]["resources"]["requests"] == {"cpu": "1"}
    assert not (out / "mig-parted-config.configmap.yaml").exists()  # a CPU plan: no layout
    missing = ridgeline(
        "export",
        "kserve",
        str(tmp_path / "nope.yaml"),
        "--out",
        str(out),
        "--storage-uri",
        "s3://b",
    )
    assert missing.returncode == 2 and missing.stderr.startswith("error:")
    (tmp_path / "file").write_text("")
    blocked = ridgeline(
        "export", "kserve", str(EXAMPLE), "--out", str(tmp_path / "file"), "--storage-uri", "s3://b"
    )
    assert blocked.returncode == 2 and "is a file" in blocked.stderr
