"""The one process of a Ray drill that imports ``ray``: ``python -m ...ray.helper ACTION``.

The drill itself never imports ray (its ``ray.init`` would change the drill process's
signal handlers, logging and threads for the rest of a pytest session). It runs this
module as a short-lived subprocess instead, with the cluster's token in its environment,
and reads one JSON object from its stdout:

- ``resolve ADDRESS``: the dashboard's URL (the state API and Train's state are served
  there), asked of the cluster's GCS: ``{"dashboard": "http://127.0.0.1:8265"}``;
- ``request ADDRESS JSON``: one request (below), answered as the server answers it;
- ``serve ADDRESS``: connect once (``{"ready": true}``), then one request per stdin line,
  each answered with its ``id``; ends at EOF. The drill starts it at discovery, so that
  a request costs a task, not an import of ray and a ``ray.init`` (2-5 s on a busy
  machine).

The requests (``op``):

- ``gcs`` ``{"actors": [ACTOR_ID, ...]}``: what the GCS itself holds, never Train's
  state (which job code writes): each actor's class, state, job, node, pid and worker id
  as its raylet registered them, the job table (each driver's pid and address) and the
  node table (address, head or not, liveness, the session its raylet's socket is in);
- ``probe`` ``{"node", "pid", "marker"}``: a zero-CPU task pinned to the node (hard
  affinity: it runs there or not at all) reads the process there (:func:`check_here`):
  its start ticks, its parent, its title; ``{"outcome": "ok", "ticks", "raylet"}`` when
  it is a Train worker of that node's raylet, else ``refused`` / ``already_gone``;
- ``signal`` ``{"node", "pid", "ticks", "signal", "marker"}``: one signal (SIGKILL unless
  TERM, STOP or CONT), sent through a pidfd by such a task after the same checks
  (:func:`signal_here`): ``{"outcome": "killed", "at": <POSIX seconds of the signal>,
  "ticks": ...}``, or ``already_gone`` / ``refused`` with a ``detail``. Never retried
  (``max_retries=0``);
- ``raylet`` ``{"node"}``: KillNode, the node's raylet and everything it runs.

Any failure is ``{"error": "..."}`` (exit status 1 for the one-shot actions).

The drill starts it with :func:`helper_command`: ``python -I`` (isolated: the current
folder, ``PYTHON*`` variables and the user's site-packages are not on its path), given
the drill's own import path minus the current folder. The drill may run from a folder a
job writes to; a ``ray.py`` (or ``json.py``) planted there must not run with the drill's
rights and the cluster's token.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

__all__ = [
    "MARK",
    "SIGNALS",
    "WORKER_TITLE",
    "check_here",
    "environ_value",
    "helper_command",
    "is_worker_title",
    "main",
    "process_ticks",
    "request",
    "signal_here",
]

#: What starts the helper's answer lines (anything else on its stdout is Ray's).
MARK = "RECOVERYGATE-RAY "
#: The title Ray gives a Train worker's process (then ``.method`` while it runs one).
WORKER_TITLE = "ray::RayTrainWorker"


def _stat(pid: int) -> list[str] | None:
    """``/proc/PID/stat`` after the command name: field 3 (state) first."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as handle:
            stat = handle.read()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()


def process_ticks(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (``/proc/PID/stat`` field 22)."""
    fields = _stat(pid)
    return fields[19] if fields is not None and len(fields) > 19 else None


#: The signals a kill task may send (``injectFailure.type`` -> signal; CONT at cleanup).
SIGNALS = {
    "KILL": signal.SIGKILL,
    "TERM": signal.SIGTERM,
    "STOP": signal.SIGSTOP,
    "CONT": signal.SIGCONT,
}


def _title(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().split(b"\0", 1)[0].decode("utf-8", "replace")
    except OSError:
        return ""


def environ_value(pid: int, name: str) -> str | None:
    """The value of ``name`` in the process's environment (None: absent or unreadable)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            environ = handle.read(1 << 20)
    except OSError:
        return None
    prefix = name.encode() + b"="
    for entry in environ.split(b"\0"):
        if entry.startswith(prefix):
            return entry[len(prefix) :].decode("utf-8", "replace")
    return None


def is_worker_title(title: str) -> bool:
    """``ray::RayTrainWorker`` or ``ray::RayTrainWorker.<method>``, nothing else."""
    return title == WORKER_TITLE or title.startswith(WORKER_TITLE + ".")


def check_here(
    pid: int, *, ticks: str, raylet: int, marker: tuple[str, str] | None = None
) -> dict[str, Any]:
    """Whether ``pid`` of this machine is the Train worker it should be, read in ``/proc``.

    ``{"outcome": "ok", "ticks": ...}`` when it runs, started at ``ticks`` (``-``: not
    known yet), its parent is ``raylet`` (the node's raylet, which starts every Ray
    worker process), its title is a Train worker's (:data:`WORKER_TITLE`) and, with
    ``marker`` (name, value), its environment carries that marker (a cluster the drill
    started gives it to every process). ``already_gone`` when the pid is not running or
    is another process now; ``refused`` when the process is not such a worker: whatever
    Train's state (written by job code) named, it is never signalled.
    """
    fields = _stat(pid)
    if fields is None or len(fields) <= 19 or fields[0] in ("Z", "X"):
        return {"outcome": "already_gone", "detail": f"pid {pid} is not running on its node"}
    now, parent = fields[19], fields[1]
    if ticks not in ("-", now):
        return {
            "outcome": "already_gone",
            "detail": f"pid {pid} is another process now (started at tick {now}, not {ticks})",
        }
    if parent != str(raylet):
        return {
            "outcome": "refused",
            "detail": f"pid {pid} is no Ray worker of this node: its parent is pid {parent}, "
            f"not the node's raylet (pid {raylet})",
        }
    title = _title(pid)
    if not is_worker_title(title):
        return {
            "outcome": "refused",
            "detail": f"pid {pid} is no Train worker: its title is {title[:80]!r}, "
            f"not {WORKER_TITLE}",
        }
    if marker is not None and environ_value(pid, marker[0]) != marker[1]:
        return {
            "outcome": "refused",
            "detail": f"pid {pid} does not carry this drill's {marker[0]}: it is no process "
            "of the cluster the drill started",
        }
    return {"outcome": "ok", "ticks": now}


def signal_here(
    pid: int,
    ticks: str,
    sig: str = "KILL",
    *,
    raylet: int,
    marker: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """One signal to exactly that process of this machine (the drill's own, for a worker
    on its machine; the body of the kill task on any other node).

    A pidfd is opened first, and the identity (:func:`check_here`: start ticks, parent
    raylet, title, marker) is checked through ``/proc`` *after* it: the signal goes
    through the pidfd, so it reaches the process that was checked even if the pid is
    recycled in between. The answer carries the ticks seen (the exact identity for a
    later signal to the same one).
    """
    number = SIGNALS[sig]
    try:
        fd: int | None = os.pidfd_open(pid)
    except ProcessLookupError:
        return {"outcome": "already_gone", "detail": f"pid {pid} is not running on its node"}
    except (OSError, AttributeError):
        fd = None  # no pidfd (old kernel): the check and the signal are as close as can be
    try:
        checked = check_here(pid, ticks=ticks, raylet=raylet, marker=marker)
        if checked["outcome"] != "ok":
            return checked
        at = time.time()
        try:
            if fd is not None:
                signal.pidfd_send_signal(fd, number)
            else:
                os.kill(pid, number)
        except ProcessLookupError:
            return {"outcome": "already_gone", "detail": f"pid {pid} exited before the signal"}
        return {
            "outcome": "killed",
            "at": at,
            "ticks": checked["ticks"],
            "detail": f"SIG{sig} sent to pid {pid}",
        }
    finally:
        if fd is not None:
            os.close(fd)


def _my_raylet() -> tuple[int, str | None]:
    """This task's parent, the node's raylet (or why it is not one)."""
    raylet = os.getppid()
    program = _title(raylet)
    if Path(program).name != "raylet":
        return raylet, f"the task's parent {raylet} is no raylet ({program[:80]!r})"
    return raylet, None


def _marker(value: Any) -> tuple[str, str] | None:
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return str(value[0]), str(value[1])
    return None


def _probe_task(pid: int, marker: Any) -> dict[str, Any]:
    """Runs on the node, as a Ray task: :func:`check_here` against this node's raylet."""
    raylet, problem = _my_raylet()
    if problem is not None:
        return {"outcome": "refused", "detail": problem}
    return {**check_here(pid, ticks="-", raylet=raylet, marker=_marker(marker)), "raylet": raylet}


def _signal_task(pid: int, ticks: str, sig: str, marker: Any) -> dict[str, Any]:
    """Runs on the node, as a Ray task: :func:`signal_here` against this node's raylet."""
    raylet, problem = _my_raylet()
    if problem is not None:
        return {"outcome": "refused", "detail": problem}
    return signal_here(pid, ticks, sig, raylet=raylet, marker=_marker(marker))


def _children(parent: int) -> list[int]:
    """The pids whose parent is ``parent`` (``/proc/PID/stat`` field 4)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as handle:
                fields = handle.read().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        if len(fields) > 1 and fields[1] == str(parent):
            found.append(int(entry))
    return found


def _kill_raylet() -> dict[str, Any]:
    """Runs on the node, as a Ray task: a node crash. SIGKILL everything the node's raylet
    runs (its children: every Ray worker process of the node, the node's agents), then the
    raylet itself; this task's own process goes last, with its raylet.

    Measured with Ray 2.60: a raylet SIGKILLed alone leaves its Train worker training with
    its peers for about 15 s, until the cluster declares the node dead."""
    raylet, problem = _my_raylet()
    if problem is not None:
        return {"outcome": "refused", "detail": problem}
    me = os.getpid()
    at = time.time()
    ended = []
    for pid in _children(raylet):
        if pid != me:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                ended.append(pid)
    os.kill(raylet, signal.SIGKILL)
    return {
        "outcome": "killed",
        "at": at,
        "detail": f"SIGKILL sent to the raylet, pid {raylet}, and its {len(ended)} processes",
    }


def _resolve(address: str) -> dict[str, Any]:
    from ray.dashboard.utils import ray_address_to_api_server_url

    return {"dashboard": ray_address_to_api_server_url(address)}


def _connect(address: str) -> Any:
    import ray

    ray.init(
        address=address,
        log_to_driver=False,
        logging_level="ERROR",
        namespace="recoverygate",
        include_dashboard=False,
    )
    return ray


def _pinned(ray: Any, node_id: str, function: Any) -> Any:
    """``function`` as a zero-CPU task that runs on ``node_id`` or nowhere, never retried."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    strategy = NodeAffinitySchedulingStrategy(node_id, soft=False)
    return ray.remote(num_cpus=0, max_retries=0)(function).options(scheduling_strategy=strategy)


def _raylet_kill(ray: Any, node_id: str) -> dict[str, Any]:
    # The raylet's death takes this task's process too: its answer is lost, so the
    # kill time is taken here. The caller reads the outcome from the node's state.
    ref = _pinned(ray, node_id, _kill_raylet).remote()
    at = time.time()
    try:
        result: dict[str, Any] = ray.get(ref, timeout=30)
    except Exception as exc:  # the task died with its raylet: the expected answer
        return {
            "outcome": "killed",
            "at": at,
            "detail": f"the raylet task ended: {type(exc).__name__}",
        }
    return result


def _hex(value: bytes) -> str:
    return value.hex()


def _gcs(ray: Any, actor_ids: list[str]) -> dict[str, Any]:
    """What the GCS holds of these actors, of the jobs and of the nodes (never Train's
    state): as each raylet registered them, not as job code describes them."""
    from ray._private import state
    from ray.core.generated import gcs_pb2

    accessor = state.state._connect_and_get_accessor()
    actors: dict[str, dict[str, Any] | None] = {}
    for actor_id in actor_ids[:1024]:
        try:
            raw = accessor.get_actor_info(ray.ActorID(bytes.fromhex(actor_id)))
        except ValueError:  # not an actor id at all
            raw = None
        if raw is None:
            actors[actor_id] = None
            continue
        data = gcs_pb2.ActorTableData.FromString(raw)
        actors[actor_id] = {
            "class": data.class_name,
            "state": gcs_pb2.ActorTableData.ActorState.Name(data.state),
            "job": _hex(data.job_id),
            "node": _hex(data.address.node_id),
            "ip": data.address.ip_address,
            "pid": int(data.pid),
            "worker": _hex(data.address.worker_id),
        }
    jobs = [
        {
            "job": str(job["JobID"]),
            "driverPid": int(job["DriverPid"]),
            "driverIp": str(job["DriverIPAddress"]),
            "dead": bool(job["IsDead"]),
        }
        for job in state.state.job_table()
    ]
    nodes = {
        str(node["NodeID"]): {
            "alive": bool(node.get("Alive")),
            "ip": str(node.get("NodeManagerAddress", "")),
            "head": "node:__internal_head__" in (node.get("Resources") or {}),
            "raylet": str(node.get("RayletSocketName", "")),
        }
        for node in state.state.node_table()
    }
    return {"actors": actors, "jobs": jobs, "nodes": nodes}


def request(ray: Any, req: dict[str, Any]) -> dict[str, Any]:
    """One request of the drill (see the module's docstring), answered."""
    op = req.get("op")
    if op == "gcs":
        return _gcs(ray, [str(a) for a in req.get("actors") or []])
    node = str(req["node"])
    if op == "raylet":
        return _raylet_kill(ray, node)
    pid = int(req["pid"])
    if op == "probe":
        task = _pinned(ray, node, _probe_task).remote(pid, req.get("marker"))
    elif op == "signal":
        sig = str(req.get("signal", "KILL"))
        if sig not in SIGNALS:
            raise ValueError(f"no such signal {sig!r}")
        task = _pinned(ray, node, _signal_task).remote(
            pid, str(req["ticks"]), sig, req.get("marker")
        )
    else:
        raise ValueError(f"no such request {op!r}")
    answer: dict[str, Any] = ray.get(task, timeout=60)
    return answer


def _import_path() -> list[str]:
    """The drill's import path for the helper: every absolute entry of ``sys.path`` except
    the current folder (``''`` or its path, which ``python -m`` / ``-c`` put first), and
    this package's root at the end when it is not among them."""
    root = str(Path(__file__).resolve().parents[3])
    cwd = os.getcwd()
    path: list[str] = []
    for entry in sys.path:
        if entry and os.path.isabs(entry) and entry != cwd and entry not in path:
            path.append(entry)
    if root not in path:
        path.append(root)
    return path


def helper_command(*args: str) -> list[str]:
    """The command line that runs this module with ``args``: isolated (``python -I``),
    with the drill's import path (:func:`_import_path`) and nothing from the current
    folder."""
    boot = (
        "import sys, runpy; "
        f"sys.path[:] = {_import_path()!r}; "
        f"runpy.run_module({__name__!r}, run_name='__main__', alter_sys=True)"
    )
    return [sys.executable, "-I", "-c", boot, *args]


def _answer(result: dict[str, Any]) -> None:
    sys.stdout.write("\n" + MARK + json.dumps(result) + "\n")
    sys.stdout.flush()


def _serve(address: str) -> int:
    ray = _connect(address)
    try:
        _answer({"ready": True})
        for line in sys.stdin:
            ident: Any = None
            try:
                req = json.loads(line)
                ident = req.get("id")
                result = request(ray, req)
            except Exception as exc:  # this request failed; the drill says so, never retries
                result = {"error": f"{type(exc).__name__}: {exc}"}
            _answer({**result, "id": ident})
    finally:
        ray.shutdown()
    return 0


def _once(address: str, text: str) -> dict[str, Any]:
    ray = _connect(address)
    try:
        req = json.loads(text)
        return {**request(ray, req), "id": req.get("id")}
    finally:
        ray.shutdown()


def main(argv: list[str]) -> int:
    try:
        if argv[:1] == ["serve"] and len(argv) == 2:
            return _serve(argv[1])
        if argv[:1] == ["resolve"] and len(argv) == 2:
            result = _resolve(argv[1])
        elif argv[:1] == ["request"] and len(argv) == 3:
            result = _once(argv[1], argv[2])
        else:
            usage = "usage: resolve ADDRESS | request ADDRESS JSON | serve ADDRESS"
            result = {"error": f"{usage} (got {argv})"}
    except Exception as exc:  # reported to the drill, which names it
        result = {"error": f"{type(exc).__name__}: {exc}"}
    _answer(result)
    return 1 if "error" in result else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
