"""The pure core: what a run decides, free of processes and I/O loops.

``engine`` (task states, readiness, retries), ``resources`` (hosts, worker slots, cpus,
memory), ``rescue`` (the durable record of finished tasks), ``protocol`` (messages
between master and workers), ``records`` (the reference's record formats) and
``events`` (the observer interface through which every state change is told).
"""
