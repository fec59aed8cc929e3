"""The whole loop: measured profiling through the serving runtime (``profiling``), verify a
served plan (``verify``), profile → plan → serve → verify → reconfigure (``run``), and the
demo on the embedded example (``demo``). Results only: ``report/`` renders them."""
