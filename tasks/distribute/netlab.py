"""Emulated hosts with their own addresses: network namespaces on one bridge, made and
deleted by whoever uses them (an emulated-link training run, the sweep's link axis, the
cluster tests).

Each host is a namespace `tfs<id>-h<i>` holding one end of a veth pair, addressed
10.<net>.0.<i+1>/24; the other end is on a bridge in a switch namespace. Only these
namespaces and their private addresses are ever addressed. A link can be cut (`down`)
and restored (`up`), and shaped to a rate with `tbf` on both ends of the host's veth
(netem is not needed). Making them needs root and `ip` (iproute2).
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def available() -> str | None:
    """Why namespace hosts cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    try:
        subprocess.run(["ip", "netns", "list"], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        return f"'ip netns' is unavailable: {exc}"
    return None


@dataclass
class Hosts:
    """Hosts on one switch: `address(i)`, `popen(i, argv)`, `cut(i)`, `restore(i)`, `shape`."""

    tag: str
    count: int
    net: int
    namespaces: list[str] = field(default_factory=list)

    def name(self, i: int) -> str:
        return f"{self.tag}-h{i}"

    @property
    def switch(self) -> str:
        return f"{self.tag}-sw"

    def address(self, i: int) -> str:
        return f"10.{self.net}.0.{i + 1}"

    def popen(self, i: int, argv: list[str], **kwargs) -> subprocess.Popen:
        """Runs `argv` on host `i` (in its namespace, with this process's environment)."""
        return subprocess.Popen(["ip", "netns", "exec", self.name(i), *argv], **kwargs)

    def cut(self, i: int) -> None:
        """Takes host `i`'s link down: its traffic to every other host is dropped."""
        _ip("-n", self.switch, "link", "set", f"{self.tag}-p{i}", "down")

    def restore(self, i: int) -> None:
        _ip("-n", self.switch, "link", "set", f"{self.tag}-p{i}", "up")

    def shape(self, i: int, rate: str) -> None:
        """Limits host `i`'s link to `rate` (e.g. "100mbit") in both directions."""
        for ns, dev in ((self.name(i), self.name(i)), (self.switch, f"{self.tag}-p{i}")):
            _ip("netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", "tbf",
                "rate", rate, "burst", "64kb", "latency", "400ms")  # fmt: skip

    def unshape(self, i: int) -> None:
        """Takes host `i`'s link back to full speed."""
        for ns, dev in ((self.name(i), self.name(i)), (self.switch, f"{self.tag}-p{i}")):
            subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root"],
                           capture_output=True)  # fmt: skip

    def create(self) -> None:
        _ip("netns", "add", self.switch)
        self.namespaces.append(self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for i in range(self.count):
            host, port = self.name(i), f"{self.tag}-p{i}"
            _ip("netns", "add", host)
            self.namespaces.append(host)
            _ip("link", "add", host, "type", "veth", "peer", "name", port)
            _ip("link", "set", host, "netns", host)
            _ip("link", "set", port, "netns", self.switch)
            _ip("-n", self.switch, "link", "set", port, "master", "br0")
            _ip("-n", self.switch, "link", "set", port, "up")
            _ip("-n", host, "addr", "add", f"{self.address(i)}/24", "dev", host)
            _ip("-n", host, "link", "set", host, "up")
            _ip("-n", host, "link", "set", "lo", "up")
        self._write_hosts_files()

    def _write_hosts_files(self) -> None:
        """Each host resolves every host's name (`ip netns exec` mounts /etc/netns/NS/hosts
        over /etc/hosts), as nodes of a cluster do."""
        names = "".join(f"{self.address(i)} {self.name(i)}\n" for i in range(self.count))
        for i in range(self.count):
            path = Path("/etc/netns") / self.name(i) / "hosts"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"127.0.0.1 localhost\n{names}")

    def delete(self) -> None:
        """Deletes every namespace made (their veth ends go with them), after ending what
        still runs on it: a process left there (a job step a failure stranded) would outlive
        its host, detached from every namespace's name."""
        for ns in reversed(self.namespaces):
            end_processes_in(ns)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)
        self.namespaces.clear()


def end_processes_in(ns: str) -> None:
    """SIGKILLs every process in namespace `ns` (`ip netns pids`)."""
    listed = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
    for pid in filter(str.isdigit, listed.stdout.split()):
        with suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)


_made = itertools.count()


def rate_text(gbit: float) -> str:
    """A rate for `tc` (its own units: "1gbit", "100mbit")."""
    return f"{gbit * 1000:g}mbit"


@contextmanager
def namespace_hosts(count: int) -> Iterator[Hosts]:
    """`count` hosts on one switch, deleted on exit, also when what uses them fails. Each
    set made by a process has its own names (interface names stay within 15 characters)."""
    n = next(_made)
    tag = f"tfs{os.getpid() % 100000}" + (f"n{n}" if n else "")
    hosts = Hosts(tag, count, net=100 + (os.getpid() + n) % 100)
    try:
        hosts.create()
        yield hosts
    finally:
        hosts.delete()
