"""The Open Inference Protocol v2 (KServe v2 / Triton), independent of any one server:
tensor codecs for HTTP and gRPC and the specs they validate against."""
