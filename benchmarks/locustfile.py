"""The peer for benchmarks/loadgen.py: locust's FastHttpUser at a constant throughput,
posting the same v2 infer body that ridgeline sends."""

import os

from locust import FastHttpUser, constant_throughput, task

PER_USER_RPS = float(os.environ.get("RIDGELINE_BENCH_PER_USER_RPS", "10"))
MODEL = os.environ.get("RIDGELINE_BENCH_MODEL", "fake")
BODY = os.environ["RIDGELINE_BENCH_BODY"]


class V2Infer(FastHttpUser):
    wait_time = constant_throughput(PER_USER_RPS)

    @task
    def infer(self) -> None:
        self.client.post(
            f"/v2/models/{MODEL}/infer", data=BODY, headers={"Content-Type": "application/json"}
        )
