"""pmc: run a DAG of many short tasks inside one MPI job (a Python pegasus-mpi-cluster)."""

__version__ = "0.1.0"
