"""The DAG: the package face of ``pmc.dag``.

Rooms, bottom to top: ``model`` (Task, DAG, DagError), ``words`` (shell words of a
command), ``lines`` (a file's lines and a line's fields), ``taskline`` (TASK options),
``graph`` (edges to CSR, cycle check), ``edgehelper`` (the second process for a big
file's EDGE lines), ``reader`` (``parse_dag``).
"""

from pmc.dag.model import DAG, DagError, Task
from pmc.dag.words import split_command


def parse_dag(path: str) -> DAG:
    """``pmc.dag.reader.parse_dag``: the reader's rooms are imported when a DAG is read,
    not by every worker (which needs only ``split_command``)."""
    from pmc.dag.reader import parse_dag as parse

    return parse(path)

__all__ = ["DAG", "DagError", "Task", "parse_dag", "split_command"]
