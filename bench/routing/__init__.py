"""The side-by-side routing benchmark (``python -m bench.routing``, docs/routing.md): EPP's profiles, through its
gateway and through Envoy, against a round-robin baseline and the vLLM and SGLang Rust routers, over a simulated pool
in real time, every router sent the same seeded open-loop schedule on a cold pool.

Modules: ``workloads`` (the schedules and their pools), ``pool`` (the simulated servers), ``routers`` (the routers
under test), ``rr`` (the round-robin proxy), ``runner`` (open-loop replay and per-request outcomes), ``floor`` (the
TTFT floor from the simulator's time model), ``report`` (rows and tables), ``plots`` (PNG plots), ``venvs`` (venvs
for the peers and matplotlib), ``procs`` (child processes by PID).
"""
