"""The running program: the master's loop (rank 0) and the workers that launch, watch
and reap tasks, over any ``pmc.transport``."""
