"""A tiny MPI program for tests of multi-rank tasks: each rank appends one line
"RANK SIZE HOST" to the file named by its first argument (O_APPEND: lines whole)."""

import os
import socket
import sys

from mpi4py import MPI

comm = MPI.COMM_WORLD
line = f"{comm.Get_rank()} {comm.Get_size()} {socket.gethostname()}\n".encode()
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
try:
    os.write(fd, line)
finally:
    os.close(fd)
comm.Barrier()
