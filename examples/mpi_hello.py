"""A tiny MPI program for examples/mpi-task.dag: each rank says who it is, and rank 0
how many ranks ran and on which hosts."""

import socket

from mpi4py import MPI

comm = MPI.COMM_WORLD
hosts = comm.gather(socket.gethostname(), root=0)
if comm.Get_rank() == 0:
    print(f"{comm.Get_size()} ranks on {','.join(sorted(set(hosts or [])))}", flush=True)
