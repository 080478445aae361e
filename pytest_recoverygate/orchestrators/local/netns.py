"""Network namespaces for the local backend's nodes: one network per drill, one namespace
per node, nothing outside them (docs/nodes.md).

The layout of one drill (``ID`` is the drill's random id)::

    rgID-sw        a switch namespace: bridge br0, one veth port per node (n0, n1, ...)
    rgID-n0        node 0: eth0 10.77.0.1/24 (its peer n0 on br0), lo up
    rgID-n1        node 1: eth0 10.77.0.2/24 ...
    rgID-n1-r1     node 1's first replacement (fresh namespace, same address, port n1r1)

The bridge lives in a namespace the drill made, not in the host's: no address of the
drill's network exists outside its namespaces, so its traffic cannot leave them, and two
drills (each with its own switch) never clash even with the same addresses.

A node's processes run in its network namespace, in a UTS namespace of their own (its
hostname) and a mount namespace of their own where the drill's hosts file (every node's
hostname and address) is bind-mounted over ``/etc/hosts``: torchrun's c10d rendezvous
resolves the hostnames. Its mounts are slaves (``--propagation slave``): nothing mounted
in a node reaches the host, and what the host shares reaches the node (a StorageFault's
layer over the checkpoint folder is shared, so its read-only bind and its unmount reach
every node; the host's other mounts are private and stay as the node copied them).
:func:`node_command` wraps the node's command so: ``nsenter --net`` enters the
namespace, ``unshare --uts --mount`` makes the other two, and a shell sets the hostname,
mounts the hosts file and execs the command (the launched pid stays the command's).

A node's identity is its namespace's name and the time the drill made it (the netns
inode is no identity: this machine's sandbox reuses it). A partition takes the node's
bridge port down (the node's eth0 loses its carrier; its processes keep running, their
packets go nowhere) and brings it back up. :meth:`Network.close` deletes every namespace
(and with them every veth) it made and checks that none is left.

Everything here runs ``ip`` (iproute2); it needs CAP_NET_ADMIN and CAP_SYS_ADMIN
(:func:`missing_capabilities`). As root, every tool (``ip``, ``nsenter``, ``unshare``,
``mount``, ``hostname``) is run by its absolute path from a fixed list of system folders
(:data:`TRUSTED_TOOL_DIRS`, :func:`tool_path`), never looked up on ``PATH``: root's
``PATH`` may name a folder a user or a job can write to.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import stat
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from pytest_recoverygate.errors import BackendError, PermissionDeniedError

__all__ = [
    "ADDRESS_PREFIX",
    "IFACE",
    "Network",
    "NodeNet",
    "delete_netns",
    "is_trusted_tool",
    "missing_capabilities",
    "node_command",
    "require_capabilities",
    "tool_path",
]

#: The drill network's /24 (inside the drill's own namespaces only); node k is .k+1.
ADDRESS_PREFIX = "10.77.0"
#: The node's interface on the drill network (what GLOO_SOCKET_IFNAME names).
IFACE = "eth0"
NETNS_DIR = Path("/run/netns")
IP_TIMEOUT = 10.0  # seconds one ip command may take

#: Where root's privileged tools are taken from, in this order (never from PATH).
TRUSTED_TOOL_DIRS = ("/usr/sbin", "/usr/bin", "/sbin", "/bin")
_TOOLS = ("ip", "nsenter", "unshare", "mount", "hostname")

_CAP_NET_ADMIN = 12
_CAP_SYS_ADMIN = 21


def tool_path(name: str, *, root: bool | None = None) -> str | None:
    """The program ``name`` to run: as root (``root``, default: the effective uid is 0),
    the first of :data:`TRUSTED_TOOL_DIRS` that holds it as a root-owned executable file
    that neither its group nor others may write; otherwise the ``PATH`` lookup."""
    if root is None:
        root = os.geteuid() == 0
    if not root:
        return shutil.which(name)
    for folder in TRUSTED_TOOL_DIRS:
        path = os.path.join(folder, name)
        if is_trusted_tool(path):
            return path
    return None


def is_trusted_tool(path: str) -> bool:
    """``path`` is an executable regular file (links followed: they are in a root-owned
    folder) owned by root that neither its group nor others may write."""
    try:
        info = os.stat(path)
    except OSError:
        return False
    return (
        stat.S_ISREG(info.st_mode)
        and info.st_uid == 0
        and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        and bool(info.st_mode & stat.S_IXUSR)
    )


def _tool(name: str) -> str:
    """:func:`tool_path`, or a BackendError naming where it was looked for."""
    path = tool_path(name)
    if path is None:
        where = ", ".join(TRUSTED_TOOL_DIRS) if os.geteuid() == 0 else "PATH"
        raise BackendError(f"the {name} program was not found (looked in {where})")
    return path


def missing_capabilities() -> list[str]:
    """The capabilities a multi-node drill needs that this process lacks."""
    try:
        status = Path("/proc/self/status").read_text(encoding="utf-8")
    except OSError:
        return ["CAP_NET_ADMIN", "CAP_SYS_ADMIN"]
    effective = 0
    for line in status.splitlines():
        if line.startswith("CapEff:"):
            effective = int(line.split()[1], 16)
    missing = [
        name
        for name, bit in (("CAP_NET_ADMIN", _CAP_NET_ADMIN), ("CAP_SYS_ADMIN", _CAP_SYS_ADMIN))
        if not effective & (1 << bit)
    ]
    for tool in _TOOLS:
        if tool_path(tool) is None:
            where = "a root-owned file in " + ", ".join(TRUSTED_TOOL_DIRS)
            missing.append(
                f"the {tool} program (util-linux / iproute2"
                f"{'; ' + where if os.geteuid() == 0 else ''})"
            )
    return missing


def require_capabilities(nodes: int) -> None:
    """Refuse, before anything starts, a multi-node drill this process cannot set up."""
    missing = missing_capabilities()
    if missing:
        raise PermissionDeniedError(
            f"workload.nodes: {nodes} runs each node in its own network namespace, which "
            f"needs {', '.join(missing)}; run the drill as root (sudo), or in a container "
            "with --cap-add NET_ADMIN --cap-add SYS_ADMIN; nothing was started"
        )


def _ip(*args: str) -> str:
    """Run ``ip ARGS``; a failure is a BackendError naming the command and its output."""
    try:
        done = subprocess.run(
            [_tool("ip"), *args], capture_output=True, text=True, timeout=IP_TIMEOUT, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BackendError(f"`ip {' '.join(args)}` could not run: {exc}") from exc
    if done.returncode != 0:
        raise BackendError(
            f"`ip {' '.join(args)}` failed ({done.returncode}): {done.stderr.strip()}"
        )
    return done.stdout


def delete_netns(name: str) -> None:
    """``ip netns delete NAME`` when it exists (its veth ends and a bridge in it go too)."""
    if (NETNS_DIR / name).exists():
        _ip("netns", "delete", name)


@dataclass(frozen=True, slots=True)
class NodeNet:
    """One node's namespace: its name, when it was made, its address and hostname."""

    rank: int
    netns: str
    created: float
    address: str
    hostname: str
    port: str  # its veth end on the switch's bridge

    @property
    def identity(self) -> str:
        return f"{self.netns}@{self.created:.6f}"


class Network:
    """The drill's network: a switch namespace with a bridge, and one namespace per node."""

    def __init__(self, nodes: int, hosts_file: Path, drill_id: str | None = None) -> None:
        self.drill_id = drill_id or secrets.token_hex(3)
        self.nodes = nodes
        self.hosts_file = hosts_file
        self.switch = f"rg{self.drill_id}-sw"
        self._made: list[str] = []  # every namespace made, in order
        self._cut: set[str] = set()  # bridge ports taken down
        self._replacements: dict[int, int] = {}
        self._lock = threading.Lock()
        self._closed = False

    @staticmethod
    def hostname(drill_id: str, rank: int) -> str:
        return f"rg{drill_id}-node{rank}"

    def address(self, rank: int) -> str:
        return f"{ADDRESS_PREFIX}.{rank + 1}"

    def _add_netns(self, name: str) -> None:
        _ip("netns", "add", name)
        with self._lock:
            self._made.append(name)

    def open(self) -> list[NodeNet]:
        """Make the switch and every node; write the hosts file. Undone by :meth:`close`."""
        self._add_netns(self.switch)
        _ip("-n", self.switch, "link", "set", "lo", "up")
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"]
        lines += [
            f"{self.address(rank)} {self.hostname(self.drill_id, rank)}"
            for rank in range(self.nodes)
        ]
        self.hosts_file.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return [self.add_node(rank) for rank in range(self.nodes)]

    def add_node(self, rank: int) -> NodeNet:
        """A fresh namespace for node ``rank`` (a replacement after the first), wired up."""
        with self._lock:
            generation = self._replacements.get(rank)
            self._replacements[rank] = 0 if generation is None else generation + 1
            generation = self._replacements[rank]
        suffix = f"-r{generation}" if generation else ""
        netns = f"rg{self.drill_id}-n{rank}{suffix}"
        port = f"n{rank}{suffix.replace('-', '')}"  # n1, n1r1: a dying pair's name may linger
        self._add_netns(netns)
        created = time.time()
        address = self.address(rank)
        _ip("-n", self.switch, "link", "add", port, "type", "veth", "peer", "name", IFACE,
            "netns", netns)  # fmt: skip
        _ip("-n", self.switch, "link", "set", port, "master", "br0")
        _ip("-n", self.switch, "link", "set", port, "up")
        _ip("-n", netns, "link", "set", "lo", "up")
        _ip("-n", netns, "addr", "add", f"{address}/24", "dev", IFACE)
        _ip("-n", netns, "link", "set", IFACE, "up")
        return NodeNet(rank, netns, created, address, self.hostname(self.drill_id, rank), port)

    def remove_node(self, node: NodeNet) -> None:
        """Delete a node's namespace and its bridge port (the veth pair goes with them)."""
        with self._lock:
            self._cut.discard(node.port)
        with contextlib.suppress(BackendError):  # already gone with the namespace
            _ip("-n", self.switch, "link", "del", node.port)
        self._delete(node.netns)

    def cut(self, node: NodeNet) -> None:
        """Partition the node: its bridge port down (its processes keep running)."""
        with self._lock:
            self._cut.add(node.port)
        _ip("-n", self.switch, "link", "set", node.port, "down")

    def restore(self, node: NodeNet) -> bool:
        """End the node's partition; False when it was not cut."""
        with self._lock:
            if node.port not in self._cut:
                return False
            self._cut.discard(node.port)
        _ip("-n", self.switch, "link", "set", node.port, "up")
        return True

    def _delete(self, name: str) -> None:
        delete_netns(name)

    def close(self) -> list[str]:
        """Restore every cut link, delete every namespace made; what could not go, named."""
        with self._lock:
            if self._closed:
                return []
            self._closed = True
            made = list(self._made)
            cut = set(self._cut)
        problems: list[str] = []
        for port in cut:  # the links back first, whatever fails after
            try:
                _ip("-n", self.switch, "link", "set", port, "up")
            except BackendError as exc:
                problems.append(str(exc))
        for name in reversed(made):
            try:
                self._delete(name)
            except BackendError as exc:
                problems.append(str(exc))
        left = [name for name in made if (NETNS_DIR / name).exists()]
        if left:
            problems.append(f"network namespaces left: {', '.join(left)} (ip netns delete NAME)")
        return problems

    @staticmethod
    def leftovers(drill_id: str) -> list[str]:
        """The namespaces of drill ``drill_id`` that still exist (for the leftover checks)."""
        if not NETNS_DIR.is_dir():
            return []
        return sorted(p.name for p in NETNS_DIR.iterdir() if p.name.startswith(f"rg{drill_id}-"))


def node_command(node: NodeNet, hosts_file: Path, command: list[str]) -> list[str]:
    """``command`` run inside the node: its network, hostname and hosts file (every tool
    by its path from :func:`tool_path`, ``hostname`` and ``mount`` too)."""
    script = '"$1" "$3" && "$2" --bind "$4" /etc/hosts && shift 4 && exec "$@"'
    return [
        _tool("nsenter"),
        f"--net={NETNS_DIR / node.netns}",
        "--",
        _tool("unshare"),
        "--uts",
        "--mount",
        "--propagation",
        "slave",
        "--",
        "/bin/sh",
        "-c",
        script,
        "recoverygate-node",
        _tool("hostname"),
        _tool("mount"),
        node.hostname,
        str(hosts_file),
        *command,
    ]
