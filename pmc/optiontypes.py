"""What a run option is (``Option``, a row of the table in ``pmc.options``) and its values:
the converters from command-line (or environment, or profile) text to the values of the
run options, and the JSON schema a site profile value of each must match. A converter
raises ``argparse.ArgumentTypeError`` with the message a user sees; the option table
names one per option.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from typing import Any, NamedTuple

from pmc.launchtemplate import check_template

# ASCII digits only: int() and float() also take "1_000" and other scripts' digits,
# which the reference's sscanf() reads otherwise ("1_000" as 1).
_WHOLE = re.compile(r"[+-]?[0-9]+")
# The reference's whole-number options read with sscanf("%d"), which stops at a decimal
# point: "-m 99.1" is 99 there, so it is here. Any other trailing text ("1e3", "12abc",
# which sscanf also reads as a number) stays an error.
_WHOLE_WITH_FRACTION = re.compile(r"([+-]?[0-9]+)(?:\.[0-9]*)?")
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def whole(text: str, minimum: int, pattern: re.Pattern[str] = _WHOLE) -> int:
    m = pattern.fullmatch(text.strip(" \t\n"))
    if not m:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}")
    value = int(m.group(1) if m.groups() else m.group(0))
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
    return value


def positive_int(text: str) -> int:
    return whole(text, 1)


def nonneg_int(text: str) -> int:
    return whole(text, 0)


def ref_positive_int(text: str) -> int:
    """A whole number >= 1 of the reference's options (a fraction is cut off, as there)."""
    return whole(text, 1, _WHOLE_WITH_FRACTION)


def ref_nonneg_int(text: str) -> int:
    """A whole number >= 0 of the reference's options (a fraction is cut off, as there)."""
    return whole(text, 0, _WHOLE_WITH_FRACTION)


def _positive(text: str, unit: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {unit}, got {text!r}") from None
    if not 0 < value < float("inf"):  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be a positive number of {unit}, got {text}")
    return value


def minutes(text: str) -> float:
    """--max-wall-time: 0 is no limit, as in the reference (which also takes a negative
    number, nan or inf without a word; refused here as the mistakes they must be)."""
    if not _DECIMAL.fullmatch(text.strip(" \t\n")):
        raise argparse.ArgumentTypeError(f"expected minutes, got {text!r}")
    value = float(text)
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(
            f"must be a number of minutes >= 0 (0: no limit), got {text}")
    return value


def seconds(text: str) -> float:
    return _positive(text, "seconds")


def nonneg_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0, got {text}")
    return value


def port(text: str) -> int:
    value = nonneg_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"not a TCP port: {value}")
    return value


class Ports(NamedTuple):
    """A range of TCP ports to try in order (``--metrics-port 9466-9475``)."""

    first: int
    last: int

    def __str__(self) -> str:
        return f"{self.first}-{self.last}"


def port_or_range(text: str) -> int | Ports:
    """A TCP port (0: any free one), or a range ``FIRST-LAST`` to try in order."""
    first, dash, last = text.strip().partition("-")
    if not dash:
        return port(first)
    lo, hi = port(first), port(last)
    if lo == 0 or hi < lo:
        raise argparse.ArgumentTypeError(f"not a range of TCP ports: {text!r} (FIRST-LAST, "
                                         "0 < FIRST <= LAST)")
    return Ports(lo, hi)


class Listen(NamedTuple):
    """Where an open run listens on TCP (``--open-tcp``): ``host`` is "" for every
    interface, else an address, a host name or an interface's name; ports ``first`` to
    ``last`` are tried in order (0: any free port)."""

    host: str
    first: int
    last: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host or "*"
        ports = str(self.first) if self.first == self.last else f"{self.first}-{self.last}"
        return f"{host}:{ports}"


_HOST = re.compile(r"[A-Za-z0-9_.%:-]+")


def listen_address(text: str) -> Listen:
    """``[HOST][:PORT]``: HOST an address (an IPv6 one in brackets when a port follows),
    a host name, an interface's name or ``*`` (every interface, the default); PORT a
    port or FIRST-LAST (default 0: any free port). A number alone is a port."""
    spec = text.strip()
    if not spec:
        raise argparse.ArgumentTypeError("expected [HOST][:PORT], got nothing")
    host, port_text = spec, ""
    if spec.startswith("["):
        inside, bracket, rest = spec[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise argparse.ArgumentTypeError(f"not an address: {text!r} ([IPV6]:PORT)")
        host, port_text = inside, rest[1:]
    elif spec.count(":") == 1:
        host, _, port_text = spec.partition(":")
    elif re.fullmatch(r"[0-9]+(-[0-9]+)?", spec):
        host, port_text = "", spec
    host = "" if host == "*" else host
    if host and not _HOST.fullmatch(host):
        raise argparse.ArgumentTypeError(f"not a host, address or interface: {host!r}")
    ports = port_or_range(port_text) if port_text else 0
    first, last = (ports, ports) if isinstance(ports, int) else ports
    return Listen(host, first, last)


def path_or_none(text: str) -> str | None:
    return text or None  # PMC_HOST_SCRIPT set but empty: no host script


def launcher_template(text: str) -> str:
    """--task-launcher: a template whose words and placeholders can be used."""
    try:
        check_template(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


# What a profile value of each converter's type must look like (JSON schema). The value
# is then also checked by the converter itself (``check_profile_value``), which refuses
# what a schema cannot (nan, inf).
SCHEMA_OF: dict[Callable[[str], Any], dict[str, Any]] = {
    positive_int: {"type": "integer", "minimum": 1},
    nonneg_int: {"type": "integer", "minimum": 0},
    ref_positive_int: {"type": "integer", "minimum": 1},
    ref_nonneg_int: {"type": "integer", "minimum": 0},
    seconds: {"type": "number", "exclusiveMinimum": 0},
    nonneg_seconds: {"type": "number", "minimum": 0},
    minutes: {"type": "number", "minimum": 0},
    port: {"type": "integer", "minimum": 0, "maximum": 65535},
    port_or_range: {"oneOf": [{"type": "integer", "minimum": 0, "maximum": 65535},
                              # a port as text too: --set metrics.port=9466
                              {"type": "string", "pattern": "^[0-9]+(-[0-9]+)?$"}]},
    launcher_template: {"type": "string"},
    listen_address: {"oneOf": [{"type": "string", "minLength": 1},
                               {"type": "integer", "minimum": 0, "maximum": 65535}]},
    str: {"type": "string"},
}


class Option(NamedTuple):
    """One run option. ``kind``: "value" (takes an argument), "flag" (store_true),
    "count" (repeatable flag), "const" (stores ``const`` in ``dest``, exclusive with
    the other "const" options of the same ``dest``).

    ``field``: the ``RunOptions`` attribute it fills ("" for none), through ``to_field``
    when given. ``env``: the environment variable read when the option is not given,
    converted by ``env_type`` (default ``type``). ``profile``: the dotted site profile
    key (``pmc.tries``, ``logging.format``) whose value a batch script passes; None when
    the profile cannot set it or sets it another way (``host.cpus``, ``walltime``).
    ``extension``: beyond the reference, listed under "pmc options" in ``--help``.
    ``worker``: workers need it (it reaches them in their ``WorkerConfig``). ``only_in``:
    the one mode ("mpi", "local") where it has an effect; given in the other, the run says
    so (``without_effect``)."""

    flags: tuple[str, ...]
    dest: str
    help: str
    kind: str = "value"
    type: Callable[[str], Any] = str
    default: Any = None
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    const: str | None = None
    env: str | None = None
    env_type: Callable[[str], Any] | None = None
    profile: str | None = None
    profile_help: str | None = None
    extension: bool = False
    worker: bool = False
    field: str | None = None
    to_field: Callable[[Any], Any] | None = None
    only_in: str | None = None

    @property
    def attr(self) -> str:
        return self.dest if self.field is None else self.field

    @property
    def long(self) -> str:
        return max(self.flags, key=len)

    def schema(self) -> dict[str, Any]:
        """The JSON schema of this option's profile value."""
        if self.kind == "flag":
            out: dict[str, Any] = {"type": "boolean"}
        elif self.kind == "count":
            out = {"type": "integer", "minimum": 0, "maximum": 5}
        elif self.choices is not None:
            out = {"enum": list(self.choices)}
        else:
            out = dict(SCHEMA_OF[self.type])
        text = self.profile_help or (self.help if self.help != argparse.SUPPRESS else None)
        if text:
            out["description"] = f"{self.long}: {text}"
        return out
