"""A ridgeline Plan as a Triton model repository (``ridgeline export triton``).

Per task, ``TASK/config.pbtxt`` and its model: ``TASK/1/model.onnx`` (``onnxruntime_onnx``,
the file ``serve.loading.task_backend`` resolves, copied) or, for a synthetic task,
``TASK/1/model.py`` (the Python backend sleeping ``base_ms + per_item_ms·rows`` and
answering 2·input, ``_triton_model.py``). Each config carries the plan's decisions:

* ``max_batch_size`` = the planned batch size; ``dynamic_batching`` with the plan's
  ``preferred_batch_sizes`` (or the batch size), ``max_queue_delay_microseconds`` from
  ``max_queue_delay_ms`` and a queue policy rejecting a request that waited longer than
  the task's latency budget, in a queue of ``QUEUE_ROUNDS`` full rounds of batches;
* ``instance_group`` from the segment: ``KIND_CPU`` × instances (onnxruntime's intra-op
  threads = the segment's); a whole GPU per instance (``KIND_GPU``, the plan's ``gpus``);
  a MIG slice or MPS share as one instance on device 0. One Triton process sees one MIG
  device (``CUDA_VISIBLE_DEVICES=MIG-<uuid>``), so a MIG task runs as one tritonserver
  per MIG device, the plan's instances of them: what ``export.kserve`` writes as the
  replicas of an InferenceService. An MPS share also sets
  ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` in that process.

The graph is an ensemble named after the plan: its inputs the source tasks' (which share
one signature, as the runtime requires), its outputs every sink task's, ``TASK.OUTPUT``.
Tensor wiring cannot fan a parent's rows out to ``rows × factor`` child rows, so every
edge is a small Python model ``PARENT_to_CHILD`` between the two steps doing what the
runtime's ``serve.graph.adapt`` does. Triton hands a step's whole tensor to the next model
as one request, so the ensemble's ``max_batch_size`` is the most rows whose fan-out fits
every task's batch size. Joins (a task with two parents) have no ensemble form and are
refused. Every written config is parsed back with Triton's ``ModelConfig`` protobuf and
the ensemble's wiring checked before the paths are returned.
"""

from __future__ import annotations

import math
import shutil
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ridgeline.errors import ConfigError, PlanError
from ridgeline.pipeline.plan import Plan, TaskPlan
from ridgeline.pipeline.segments import CpuSegment, GpuSegment
from ridgeline.policies import glue
from ridgeline.serve.backends import OnnxBackendConfig, SyntheticBackendConfig
from ridgeline.serve.loading import task_backend, zoo_dir
from ridgeline.v2.spec import Signature, TensorSpec, triton_type

QUEUE_ROUNDS = 4
"""A task's queue holds this many full rounds of batches over its instances; past that
Triton rejects at once instead of queueing past the budget."""


def onnx_signature(task: str, path: Path) -> Signature:
    """Inputs and outputs of an ONNX graph: symbolic dims become -1 (the batch dim first)."""
    import onnx

    from ridgeline.zoo.manifest import tensor_specs

    graph = onnx.load(str(path), load_external_data=False).graph
    try:
        return Signature(tensor_specs(list(graph.input)), tensor_specs(list(graph.output)))
    except ConfigError as e:
        raise PlanError(f"tasks.{task}: {path}: {e}") from None


def _tensors(specs: Sequence[TensorSpec], *, batched: bool) -> list[dict[str, Any]]:
    """``input``/``output`` entries: a batching model's dims leave the batch dim out."""
    return [
        {
            "name": s.name,
            "data_type": triton_type(s.datatype),
            "dims": list(s.shape[1:] if batched else (-1, *s.shape[1:])),
        }
        for s in specs
    ]


def instance_groups(task: TaskPlan) -> list[dict[str, Any]]:
    """Where a task's instances run (see the module docstring)."""
    seg = task.segment
    if isinstance(seg, CpuSegment):
        return [{"count": task.instances, "kind": "KIND_CPU"}]
    if isinstance(seg, GpuSegment):
        on = Counter(task.gpus if task.gpus is not None else range(task.instances))
        return [{"count": n, "kind": "KIND_GPU", "gpus": [g]} for g, n in sorted(on.items())]
    return [{"count": 1, "kind": "KIND_GPU", "gpus": [0]}]


def _params(values: dict[str, object]) -> dict[str, Any]:
    return {k: {"string_value": str(v)} for k, v in values.items()}


def task_config(name: str, task: TaskPlan, sig: Signature, synthetic: bool) -> dict[str, Any]:
    """One task's ``ModelConfig``, as the dict ``json_format.ParseDict`` reads."""
    groups = instance_groups(task)
    batching = {
        "preferred_batch_size": list(task.preferred_batch_sizes or (task.batch_size,)),
        "max_queue_delay_microseconds": round(task.max_queue_delay_ms * 1000),
        "default_queue_policy": {
            "timeout_action": "REJECT",
            "default_timeout_microseconds": round(task.latency_budget_ms * 1000),
            "allow_timeout_override": True,
            "max_queue_size": QUEUE_ROUNDS * task.batch_size * sum(g["count"] for g in groups),
        },
    }
    config: dict[str, Any] = {
        "name": name,
        "max_batch_size": task.batch_size,
        "input": _tensors(sig.inputs, batched=True),
        "output": _tensors(sig.outputs, batched=True),
        "instance_group": groups,
        "dynamic_batching": batching,
    }
    if synthetic:
        cost = task.synthetic
        assert cost is not None
        config["backend"] = "python"
        config["parameters"] = _params(
            {"kind": "synthetic", "base_ms": cost.base_ms, "per_item_ms": cost.per_item_ms}
        )
    else:
        config["platform"] = "onnxruntime_onnx"
        if isinstance(task.segment, CpuSegment):
            threads = task.segment.threads or task.segment.cores
            config["parameters"] = _params({"intra_op_thread_count": threads})
    return config


def glue_name(parent: str, child: str) -> str:
    return f"{parent}_to_{child}"


def glue_config(
    parent: str, child: str, factor: float, sigs: dict[str, Signature]
) -> dict[str, Any]:
    """The Python model of one edge: the parent's outputs in, the child's inputs out;
    no batching (its rows are not the request's) and one instance (the carried fraction)."""
    return {
        "name": glue_name(parent, child),
        "backend": "python",
        "max_batch_size": 0,
        "input": _tensors(sigs[parent].outputs, batched=False),
        "output": _tensors(sigs[child].inputs, batched=False),
        "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
        "parameters": _params({"kind": "glue", "factor": factor}),
    }


def ensemble_rows(plan: Plan) -> int:
    """The most rows a pipeline request may carry: every task's share of them, fanned
    out by the factors (fractions carried up), fits its batch size in one request."""
    sources = plan.sources()
    for rows in range(min(plan.tasks[s].batch_size for s in sources), 0, -1):
        worst = dict.fromkeys(sources, rows)
        for task in _order(plan):
            for e in plan.children(task):
                worst[e.target] = math.ceil(worst[task] * e.factor - 1e-9)
        if all(worst[t] <= plan.tasks[t].batch_size for t in plan.tasks):
            return rows
    one = dict.fromkeys(sources, 1)
    for task in _order(plan):
        for e in plan.children(task):
            one[e.target] = math.ceil(one[task] * e.factor - 1e-9)
            if one[e.target] > plan.tasks[e.target].batch_size:
                raise PlanError(
                    f"tasks.{e.target}.batch_size: one pipeline row fans out to "
                    f"{one[e.target]} rows of {e.target}, over its batch_size "
                    f"{plan.tasks[e.target].batch_size}, and a Triton ensemble hands them over "
                    f"as one request; raise batch_size to {one[e.target]} or more"
                )
    raise AssertionError("unreachable: one row fits every task")


def _order(plan: Plan) -> list[str]:
    """The tasks, every parent before its children."""
    done: list[str] = []
    while len(done) < len(plan.tasks):
        done += [
            t
            for t in plan.tasks
            if t not in done and all(e.source in done for e in plan.edges if e.target == t)
        ]
    return done


def ensemble_config(plan: Plan, sigs: dict[str, Signature]) -> dict[str, Any]:
    """The graph as Triton's ensemble: a step per task and per edge's glue."""
    for task in plan.tasks:
        parents = [e.source for e in plan.edges if e.target == task]
        if len(parents) > 1:
            raise PlanError(
                f"tasks.{task}: it has parents {parents}, and a Triton ensemble cannot join "
                "two edges into one task's inputs; serve this plan with `ridgeline serve`, or "
                "give each parent its own copy of the task"
            )
    sources = plan.sources()
    first = sigs[sources[0]].inputs
    for s in sources[1:]:
        if [(t.name, t.datatype) for t in sigs[s].inputs] != [(t.name, t.datatype) for t in first]:
            raise PlanError(
                f"source tasks {sources[0]!r} and {s!r} take different inputs; a pipeline's "
                "sources must share one input signature"
            )
    steps: list[dict[str, Any]] = []
    for task in _order(plan):
        edge_in = next((e for e in plan.edges if e.target == task), None)
        feed = "" if edge_in is None else f"{glue_name(edge_in.source, task)}."
        steps.append(
            {
                "model_name": task,
                "model_version": -1,
                "input_map": {t.name: feed + t.name for t in sigs[task].inputs},
                "output_map": {t.name: f"{task}.{t.name}" for t in sigs[task].outputs},
            }
        )
        for e in plan.children(task):
            glue = glue_name(task, e.target)
            steps.append(
                {
                    "model_name": glue,
                    "model_version": -1,
                    "input_map": {t.name: f"{task}.{t.name}" for t in sigs[task].outputs},
                    "output_map": {t.name: f"{glue}.{t.name}" for t in sigs[e.target].inputs},
                }
            )
    sinks = [t for t in plan.tasks if not plan.children(t)]
    outputs = [
        TensorSpec(f"{s}.{t.name}", t.datatype, t.shape) for s in sinks for t in sigs[s].outputs
    ]
    return {
        "name": plan.name,
        "platform": "ensemble",
        "max_batch_size": ensemble_rows(plan),
        "input": _tensors(first, batched=True),
        "output": _tensors(outputs, batched=True),
        "ensemble_scheduling": {"step": steps},
    }


# --- writing and checking ----------------------------------------------------------------


def _message(what: str, doc: dict[str, Any]) -> Any:
    """The dict as Triton's ``ModelConfig``; a wrong field or value names the model."""
    from google.protobuf import json_format
    from tritonclient.grpc import model_config_pb2

    try:
        return json_format.ParseDict(doc, model_config_pb2.ModelConfig())
    except json_format.ParseError as e:
        raise PlanError(f"{what}: Triton's ModelConfig refuses it: {e}") from None


def parse_config(path: Path) -> Any:
    """A written ``config.pbtxt`` parsed back with Triton's ``ModelConfig`` protobuf."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    try:
        return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())
    except text_format.ParseError as e:
        raise PlanError(f"{path}: not a Triton model config ({e}); export it again") from None


def check_ensemble(ensemble: Any, models: dict[str, Any]) -> None:
    """Every step names a model of the repository and its tensors; every step's inputs
    come from the ensemble's inputs or an earlier step; every output is produced."""
    have = {t.name for t in ensemble.input}
    for k, step in enumerate(ensemble.ensemble_scheduling.step):
        where = f"{ensemble.name}: ensemble_scheduling.step[{k}] ({step.model_name})"
        model = models.get(step.model_name)
        if model is None:
            raise PlanError(f"{where}: no model {step.model_name!r} in the repository")
        for field, declared, names in (
            ("input_map", model.input, step.input_map.keys()),
            ("output_map", model.output, step.output_map.keys()),
        ):
            unknown = set(names) - {t.name for t in declared}
            if unknown:
                raise PlanError(f"{where}: {field} names {sorted(unknown)}, not its tensors")
        missing = [t for t in step.input_map.values() if t not in have]
        if missing:
            raise PlanError(f"{where}: input_map reads {missing}, which no earlier step makes")
        have |= set(step.output_map.values())
    unmade = [t.name for t in ensemble.output if t.name not in have]
    if unmade:
        raise PlanError(f"{ensemble.name}: outputs {unmade} are made by no step")


def _header(plan: Plan, name: str, task: TaskPlan | None) -> str:
    lines = [f"# {name}: plan {plan.name!r}, written by `ridgeline export triton`"]
    if task is None:
        lines.append("# a Python model: an edge's glue (rows x factor, reshaped to the child)")
    elif not isinstance(task.segment, CpuSegment | GpuSegment):
        lines += [
            f"# segment {task.segment.label}: one tritonserver per MIG device "
            "(CUDA_VISIBLE_DEVICES=MIG-<uuid>),",
            f"# {task.instances} of them (the plan's instances); each sees its device as GPU 0",
        ]
    return "\n".join(lines) + "\n"


def export_triton(
    plan: Plan, out_dir: Path, *, plan_dir: Path = Path("."), zoo: Path | None = None
) -> list[Path]:
    """Write the plan as a Triton model repository in ``out_dir`` (see the module
    docstring), checked by parsing every config back; the paths written."""
    from google.protobuf import text_format

    if plan.name in plan.tasks:
        raise PlanError(
            f"task {plan.name!r} has the plan's own name, which the ensemble takes; rename "
            "the task or the plan"
        )
    sigs: dict[str, Signature] = {}
    configs: dict[str, tuple[dict[str, Any], TaskPlan | None, Path | None]] = {}
    for name, task in plan.tasks.items():
        backend = task_backend(name, task, plan_dir, zoo or zoo_dir())
        if isinstance(backend, SyntheticBackendConfig):
            sigs[name] = Signature(backend.inputs, backend.outputs)
            configs[name] = (task_config(name, task, sigs[name], True), task, None)
        elif isinstance(backend, OnnxBackendConfig):
            sigs[name] = onnx_signature(name, backend.path)
            configs[name] = (task_config(name, task, sigs[name], False), task, backend.path)
        else:
            raise PlanError(
                f"tasks.{name}.python: a Python backend class has no model file Triton can "
                "load; give the task an ONNX artifact, a zoo variant or a synthetic model"
            )
    for e in plan.edges:
        name = glue_name(e.source, e.target)
        if name in configs:
            raise PlanError(
                f"task {name!r} has the name of the glue of edge {e.source} -> "
                f"{e.target}; rename the task"
            )
        configs[name] = (glue_config(e.source, e.target, e.factor, sigs), None, None)
    configs[plan.name] = (ensemble_config(plan, sigs), None, None)
    messages = {name: _message(f"model {name}", doc) for name, (doc, _, _) in configs.items()}
    check_ensemble(messages[plan.name], messages)

    written: list[Path] = []
    for name, (_, planned, model) in configs.items():
        version = out_dir / name / "1"
        version.mkdir(parents=True, exist_ok=True)
        config = out_dir / name / "config.pbtxt"
        head = "" if name == plan.name else _header(plan, name, planned)
        config.write_text(head + text_format.MessageToString(messages[name]))
        written.append(config)
        if name == plan.name:
            continue
        target = version / ("model.onnx" if model is not None else "model.py")
        source = model if model is not None else Path(__file__).with_name("_triton_model.py")
        shutil.copyfile(source, target)
        written.append(target)
        if model is None:  # the Python model's glue, beside it (``policies/glue.py``)
            written.append(version / f"{glue.COPIED_AS}.py")
            shutil.copyfile(glue.__file__, written[-1])
    parsed = {p.parent.name: parse_config(p) for p in written if p.name == "config.pbtxt"}
    check_ensemble(parsed[plan.name], parsed)
    return written
