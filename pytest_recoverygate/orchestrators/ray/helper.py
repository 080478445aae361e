"""The one process of a Ray drill that imports ``ray``: ``python -m ...ray.helper ACTION``.

The drill itself never imports ray (its ``ray.init`` would change the drill process's
signal handlers, logging and threads for the rest of a pytest session). It runs this
module as a short-lived subprocess instead, with the cluster's token in its environment,
and reads one JSON object from its stdout:

- ``resolve ADDRESS``: the dashboard's URL (the state API and Train's state are served
  there), asked of the cluster's GCS: ``{"dashboard": "http://127.0.0.1:8265"}``;
- ``kill ADDRESS NODE_ID PID TICKS [SIG]``: one signal (SIGKILL unless ``SIG`` is TERM,
  STOP or CONT) to ``PID``, sent through a pidfd by a zero-CPU task pinned to ``NODE_ID``
  (hard affinity: it runs on that node or not at all), after the task checked on that
  node that ``PID`` is still the worker it was (its start time in clock ticks equals
  ``TICKS``, or with ``TICKS`` ``-`` its title is still a Ray worker's ``ray::...``):
  ``{"outcome": "killed", "at": <POSIX seconds of the signal>, "ticks": <its start
  ticks>}``, or ``{"outcome": "already_gone", "detail": ...}``. The task never retries
  (``max_retries=0``);
- ``serve ADDRESS``: connect once (``{"ready": true}``), then one signal per stdin line
  ``{"node": NODE_ID, "pid": PID, "ticks": TICKS, "signal": SIG}``, each answered as
  ``kill`` answers; ends at EOF. The drill starts it at discovery, so that a kill costs
  a task, not an import of ray and a ``ray.init`` (2-5 s on a busy machine).

Any failure is ``{"error": "..."}`` with exit status 1.

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

__all__ = ["MARK", "SIGNALS", "helper_command", "main", "process_ticks", "signal_here"]

#: What starts the helper's answer lines (anything else on its stdout is Ray's).
MARK = "RECOVERYGATE-RAY "


def process_ticks(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (``/proc/PID/stat`` field 22)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as handle:
            stat = handle.read()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else None


#: The signals a kill task may send (``injectFailure.type`` -> signal; CONT at cleanup).
SIGNALS = {
    "KILL": signal.SIGKILL,
    "TERM": signal.SIGTERM,
    "STOP": signal.SIGSTOP,
    "CONT": signal.SIGCONT,
}


def _is_ray_worker(pid: int) -> tuple[bool, str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            title = handle.read().split(b"\0", 1)[0].decode("utf-8", "replace")
    except OSError:
        title = ""
    return title.startswith("ray::"), title


def signal_here(pid: int, ticks: str, sig: str = "KILL") -> dict[str, Any]:
    """One signal to exactly that process of this machine (the drill's own, for a worker
    on its machine; the body of the kill task on any other node).

    A pidfd is opened first, and the identity (start ticks, or with ``-`` a Ray worker's
    title) is checked through ``/proc`` *after* it: the signal goes through the pidfd, so
    it reaches the process that was checked even if the pid is recycled in between. The
    answer carries the ticks seen (the exact identity for a later signal to the same one).
    """
    number = SIGNALS[sig]
    try:
        fd: int | None = os.pidfd_open(pid)
    except ProcessLookupError:
        return {"outcome": "already_gone", "detail": f"pid {pid} is not running on its node"}
    except (OSError, AttributeError):
        fd = None  # no pidfd (old kernel): the check and the signal are as close as can be
    try:
        now = process_ticks(pid)
        if now is None:
            return {"outcome": "already_gone", "detail": f"pid {pid} is not running on its node"}
        if ticks not in ("-", now):
            return {
                "outcome": "already_gone",
                "detail": f"pid {pid} is another process now (started at tick {now}, not {ticks})",
            }
        if ticks == "-":
            worker, title = _is_ray_worker(pid)
            if not worker:
                return {
                    "outcome": "already_gone",
                    "detail": f"pid {pid} is no Ray worker ({title!r})",
                }
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
            "ticks": now,
            "detail": f"SIG{sig} sent to pid {pid}",
        }
    finally:
        if fd is not None:
            os.close(fd)


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
    raylet = os.getppid()
    try:
        with open(f"/proc/{raylet}/cmdline", "rb") as handle:
            program = handle.read().split(b"\0", 1)[0].decode("utf-8", "replace")
    except OSError:
        program = ""
    if Path(program).name != "raylet":
        return {"outcome": "already_gone", "detail": f"the task's parent {raylet} is no raylet"}
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


def _pinned_kill(ray: Any, node_id: str, pid: int, ticks: str, sig: str = "KILL") -> dict[str, Any]:
    """``pid`` -1: the node's raylet; else that worker, with ``sig``."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    strategy = NodeAffinitySchedulingStrategy(node_id, soft=False)
    if pid == -1:
        # The raylet's death takes this task's process too: its answer is lost, so the
        # kill time is sent ahead through the object store... which dies as well. The
        # task is fire-and-forget; the caller reads the outcome from the node's state.
        raylet = ray.remote(num_cpus=0, max_retries=0)(_kill_raylet)
        ref = raylet.options(scheduling_strategy=strategy).remote()
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
    task = ray.remote(num_cpus=0, max_retries=0)(signal_here)
    answer: dict[str, Any] = ray.get(
        task.options(scheduling_strategy=strategy).remote(pid, ticks, sig), timeout=60
    )
    return answer


def _kill(address: str, node_id: str, pid: int, ticks: str, sig: str) -> dict[str, Any]:
    ray = _connect(address)
    try:
        return _pinned_kill(ray, node_id, pid, ticks, sig)
    finally:
        ray.shutdown()


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
            try:
                request = json.loads(line)
                sig = str(request.get("signal", "KILL"))
                if sig not in SIGNALS:
                    raise ValueError(f"no such signal {sig!r}")
                result = _pinned_kill(
                    ray, str(request["node"]), int(request["pid"]), str(request["ticks"]), sig
                )
            except Exception as exc:  # this request failed; the drill says so, never retries
                result = {"error": f"{type(exc).__name__}: {exc}"}
            _answer(result)
    finally:
        ray.shutdown()
    return 0


def main(argv: list[str]) -> int:
    try:
        if argv[:1] == ["serve"] and len(argv) == 2:
            return _serve(argv[1])
        if argv[:1] == ["resolve"] and len(argv) == 2:
            result = _resolve(argv[1])
        elif argv[:1] == ["kill"] and len(argv) in (5, 6) and (argv[5:] or ["KILL"])[0] in SIGNALS:
            result = _kill(argv[1], argv[2], int(argv[3]), argv[4], (argv[5:] or ["KILL"])[0])
        else:
            result = {
                "error": "usage: resolve ADDRESS | kill ADDRESS NODE PID TICKS "
                f"[KILL|TERM|STOP|CONT] (got {argv})"
            }
    except Exception as exc:  # reported to the drill, which names it
        result = {"error": f"{type(exc).__name__}: {exc}"}
    _answer(result)
    return 1 if "error" in result else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
