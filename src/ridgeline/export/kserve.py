"""A ridgeline Plan as KServe InferenceServices and the MIG layout their nodes take
(``ridgeline export kserve``).

One ``serving.kserve.io/v1beta1`` InferenceService per task, served by Triton on the Open
Inference Protocol (v2) from the repository ``export.triton`` writes, uploaded to
``storage_uri``: every service downloads the whole repository (Triton's runtime takes a
repository, not one model's folder) and loads its own task only
(``--model-control-mode=explicit --load-model=TASK``). Per service:

* ``minReplicas = maxReplicas`` = the plan's instances: one pod per instance, so a MIG
  task gets one MIG device per pod (one tritonserver per MIG device, as Triton needs);
* resources, requests = limits (Kubernetes requires it of extended resources): cores
  for a CPU segment; ``nvidia.com/mig-<profile>: 1`` for a MIG slice (the GPU
  operator's ``mig.strategy=mixed`` advertises them); the same for an MPS share, with
  ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` set (with the device plugin's MPS sharing of
  that resource, each share is one of its replicas); ``nvidia.com/gpu: 1`` for a whole
  GPU;
* a GPU task's ``nodeSelector`` ``nvidia.com/mig.config: <layout>``: the nodes the GPU
  operator's mig-manager has partitioned with the plan's layout, which the
  ``ConfigMap`` written beside (``config.yaml``: the mig-parted config of
  ``pipeline.placement``) holds.

The graph itself (the ensemble and its glue models) runs in one Triton process and is
not a service here: callers, or a KServe InferenceGraph, chain the tasks. Every object is
checked with the ``kubernetes`` client's models (a wrong field name or type fails)
before it is written.
"""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path
from typing import Any

import yaml

from ridgeline.errors import ConfigError, PlanError
from ridgeline.pipeline.placement import min_gpus, place
from ridgeline.pipeline.plan import Plan, TaskPlan
from ridgeline.pipeline.segments import CpuSegment, GpuSegment, MpsSegment

MIG_CONFIG_LABEL = "nvidia.com/mig.config"
"""The node label the GPU operator's mig-manager applies a layout by."""
CONTAINER = "kserve-container"
"""The name KServe gives a predictor's model container."""
_KUBERNETES = (
    "the KServe export is checked with the Kubernetes client: pip install 'ridgeline[kubernetes]'"
)


def _client() -> Any:
    try:
        from kubernetes import client
    except ImportError:
        raise ConfigError(_KUBERNETES) from None
    return client


def dns_name(*parts: str) -> str:
    """A Kubernetes object name (DNS-1035 label) from plan and task names."""
    name = re.sub(r"[^a-z0-9-]+", "-", "-".join(parts).lower()).strip("-")
    if not name or not name[0].isalpha():
        name = f"r-{name}"
    return name[:63].rstrip("-")


def resources(task: TaskPlan) -> dict[str, str]:
    """What one pod of the task asks for (requests and limits alike)."""
    seg = task.segment
    if isinstance(seg, CpuSegment):
        return {"cpu": str(seg.cores)}
    if isinstance(seg, GpuSegment):
        return {"nvidia.com/gpu": "1"}
    return {f"nvidia.com/mig-{seg.profile}": "1"}


def inference_service(
    plan: Plan, name: str, task: TaskPlan, *, storage_uri: str, namespace: str, layout: str
) -> dict[str, Any]:
    """One task's InferenceService (see the module docstring)."""
    model: dict[str, Any] = {
        "modelFormat": {"name": "triton"},
        "protocolVersion": "v2",
        "storageUri": storage_uri,
        "args": ["--model-control-mode=explicit", f"--load-model={name}"],
        "resources": {"requests": resources(task), "limits": resources(task)},
    }
    if isinstance(task.segment, MpsSegment):
        percent = str(max(1, round(task.segment.share * 100)))
        model["env"] = [{"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": percent}]
    predictor: dict[str, Any] = {
        "minReplicas": task.instances,
        "maxReplicas": task.instances,
        "model": model,
    }
    if not isinstance(task.segment, CpuSegment):
        predictor["nodeSelector"] = {MIG_CONFIG_LABEL: layout}
    return {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {
            "name": dns_name(plan.name, name),
            "namespace": namespace,
            "labels": {
                "ridgeline.io/plan": dns_name(plan.name),
                "ridgeline.io/task": dns_name(name),
            },
        },
        "spec": {"predictor": predictor},
    }


def mig_config_map(plan: Plan, layout: str, namespace: str) -> dict[str, Any] | None:
    """The mig-parted ConfigMap of the plan's layout on the fewest GPUs (None: no GPU
    task)."""
    if all(isinstance(t.segment, CpuSegment) for t in plan.tasks.values()):
        return None
    placement = place(plan, min_gpus(plan))
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": dns_name(plan.name, "mig-parted-config"), "namespace": namespace},
        "data": {"config.yaml": placement.mig_parted(layout)},
    }


class _Dumper(yaml.SafeDumper):
    """YAML with multi-line strings (the ConfigMap's config.yaml) as literal blocks."""


def _text(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_Dumper.add_representer(str, _text)


# --- checking ------------------------------------------------------------------------


class _Body:
    """What ``ApiClient.deserialize`` reads before client 34: a response's JSON body."""

    def __init__(self, doc: object) -> None:
        self.data = json.dumps(doc)


def _read(api: Any, doc: dict[str, Any], kind: str) -> Any:
    """``doc`` as the client's model ``kind``: what it makes of an API server's answer."""
    if "content_type" in inspect.signature(api.deserialize).parameters:
        return api.deserialize(json.dumps(doc), kind, "application/json")
    return api.deserialize(_Body(doc), kind)


def _round_trip(client: Any, doc: dict[str, Any], kind: str, where: str) -> None:
    """``doc`` read as the client's model ``kind`` and written back unchanged: an unknown
    field (dropped) or a wrong type (converted, or refused) fails, naming ``where``."""
    api = client.ApiClient()
    try:
        back = api.sanitize_for_serialization(_read(api, doc, kind))
    except (ValueError, TypeError) as e:
        raise PlanError(f"{where}: the Kubernetes client's {kind} refuses it: {e}") from None
    if back != doc:
        raise PlanError(
            f"{where}: as a Kubernetes {kind} it reads back as {back}, not {doc}: a field "
            "name or type the API does not have"
        )


def check_service(client: Any, doc: dict[str, Any]) -> None:
    """The parts of an InferenceService that are Kubernetes types, checked with the
    client's models; extended resources must have requests = limits."""
    where = f"InferenceService {doc['metadata']['name']}"
    _round_trip(client, doc["metadata"], "V1ObjectMeta", f"{where}: metadata")
    predictor = doc["spec"]["predictor"]
    model = predictor["model"]
    container = {
        "name": CONTAINER,
        **{k: model[k] for k in ("args", "env", "resources") if k in model},
    }
    pod = {"containers": [container], **{k: v for k, v in predictor.items() if k == "nodeSelector"}}
    _round_trip(client, pod, "V1PodSpec", f"{where}: spec.predictor")
    res = model["resources"]
    _round_trip(client, res, "V1ResourceRequirements", f"{where}: spec.predictor.model.resources")
    for key in set(res["requests"]) | set(res["limits"]):
        if "/" in key and res["requests"].get(key) != res["limits"].get(key):
            raise PlanError(f"{where}: resource {key} must have requests = limits (extended)")
    if not predictor["minReplicas"] == predictor["maxReplicas"] >= 1:
        raise PlanError(f"{where}: minReplicas and maxReplicas must be the plan's instances")


_README = """\
# {what}: plan {plan!r}, written by `ridgeline export kserve`.
# Upload the Triton repository (`ridgeline export triton PLAN --out DIR`) to
#   {storage_uri}
# then: kubectl apply -f {out}/
"""
_NODES = """\
# GPU nodes: the GPU operator with mig.strategy=mixed, its mig-manager reading this
# ConfigMap (merge its mig-configs entry into yours if you have one):
#   kubectl patch clusterpolicies.nvidia.com/cluster-policy --type merge \\
#     -p '{{"spec": {{"migManager": {{"config": {{"name": "{config_map}"}}}}}}}}'
# and on each node (with at least {gpus}) the layout's label:
#   kubectl label node NODE {label}={layout} --overwrite
# (the mig-manager partitions it; nvidia.com/mig.config.state turns to success).
"""


def export_kserve(
    plan: Plan,
    out_dir: Path,
    *,
    storage_uri: str,
    namespace: str = "default",
    operator_namespace: str = "gpu-operator",
) -> list[Path]:
    """Write ``TASK.yaml`` (an InferenceService) per task and, for a plan with GPU
    tasks, ``mig-parted-config.yaml`` (the layout's ConfigMap, in the GPU operator's
    ``operator_namespace``) to ``out_dir``, each checked with the ``kubernetes``
    client's models first; the paths written."""
    client = _client()
    layout = dns_name(plan.name)

    def readme(what: str) -> str:
        return _README.format(what=what, plan=plan.name, storage_uri=storage_uri, out=out_dir)

    docs: dict[str, tuple[str, dict[str, Any]]] = {}
    config_map = mig_config_map(plan, layout, operator_namespace)
    if config_map is not None:
        where = f"ConfigMap {config_map['metadata']['name']}"
        _round_trip(client, config_map, "V1ConfigMap", where)
        gpus = ", ".join(f"{n} × {g}" for g, n in min_gpus(plan).items())
        nodes = _NODES.format(
            config_map=config_map["metadata"]["name"],
            gpus=gpus,
            label=MIG_CONFIG_LABEL,
            layout=layout,
        )
        docs["mig-parted-config.configmap"] = (readme("the MIG layout") + nodes, config_map)
    names: dict[str, str] = {}
    for name, task in plan.tasks.items():
        doc = inference_service(
            plan, name, task, storage_uri=storage_uri, namespace=namespace, layout=layout
        )
        k8s_name = doc["metadata"]["name"]
        if k8s_name in names:
            raise PlanError(
                f"tasks {names[k8s_name]!r} and {name!r} both become the Kubernetes name "
                f"{k8s_name!r}; rename one (lowercase letters, digits and '-')"
            )
        names[k8s_name] = name
        check_service(client, doc)
        docs[name] = (readme(f"task {name}"), doc)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for stem, (head, doc) in docs.items():
        path = out_dir / f"{stem}.yaml"
        path.write_text(head + yaml.dump(doc, Dumper=_Dumper, sort_keys=False))
        written.append(path)
    return written
