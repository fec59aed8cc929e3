"""Plans to the engines users already run: a Ray Serve application (``ray_serve``),
KServe InferenceServices with the MIG layout that selects their nodes (``kserve``), and a
Triton model repository (``triton``). Each exporter reads a ``Plan`` (and where its models
come from, as ``serve.loading`` resolves them), writes files, and checks them against the
engine's own schema before it says they are done."""
