"""The peers of ``benchmarks/serve.py``: MLServer, Ray Serve and Triton around the same
onnxruntime session as ridgeline serve, and the machinery to install, start and stop
them. ``session.py``, ``mlserver_runtime.py`` and ``ray_app.py`` run inside the peers'
own virtual environment (``.bench-venv``), ``session.py`` and ``triton_model.py`` inside
Triton's (``.triton-venv``), not the project's."""
