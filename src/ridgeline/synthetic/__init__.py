"""The one latency model (batch cost, noise, warm-up, stalls, instances, batching, queue
bound) and the synthetic answer, shared by the fake server, the serving runtime's
synthetic backend, the simulator and the plan schema."""
