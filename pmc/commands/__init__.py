"""The commands a user types: ``pmc run`` / ``pegasus-mpi-cluster`` (the composition
root that wires DAG, transport, master and outputs), ``pmc status`` and ``pmc report``."""
