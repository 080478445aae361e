"""Which container instance printed a pod-log line, from a view of the pod's status.

``evidence.podLogs`` names an incarnation by the pod and its container restarts. The
kubelet serves a restarted container's log before it posts the pod's status, so a view
of the pod can trail the log (seen in CI: the resumed job's lines were taken for the
killed container's, and the drill said "never came back"). We test these aspects of
:func:`instance_of_line` on pod statuses as the kubelet writes them (whole seconds):

- a line of the running container is its instance, for sure;
- a view that still shows the previous container terminated, or waiting to restart,
  does not name a line printed after it ended (None: list again);
- a line in the second the view says the container ended may be the next one's: named,
  not sure; before that second it is that container's, for sure;
- a line of the container before the running one is that one's;
- other containers' restarts count in the total; a pod without the container: None.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from pytest_recoverygate.orchestrators.kubernetes.pods import instance_of_line, restart_total

T0 = 1_796_673_800.0  # a whole second


def stamp(t: float) -> str:
    """A status time as the kubelet writes it: whole seconds, cut."""
    return datetime.fromtimestamp(int(t), tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def running(started: float) -> dict[str, Any]:
    return {"running": {"startedAt": stamp(started)}}


def terminated(started: float, finished: float) -> dict[str, Any]:
    return {
        "terminated": {
            "exitCode": 1,
            "reason": "Error",
            "startedAt": stamp(started),
            "finishedAt": stamp(finished),
        }
    }


def pod(*statuses: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"uid": "u1"}, "status": {"containerStatuses": list(statuses)}}


def status(
    restarts: int, state: dict[str, Any], last: dict[str, Any] | None = None, name: str = "pytorch"
) -> dict[str, Any]:
    return {"name": name, "restartCount": restarts, "state": state, "lastState": last or {}}


def test_a_line_of_the_running_container_is_its_instance() -> None:
    view = pod(status(1, running(T0 + 10), terminated(T0, T0 + 5)))
    assert instance_of_line(view, None, T0 + 12.5) == (1, True)


def test_a_view_that_still_shows_the_old_container_does_not_name_a_later_line() -> None:
    ended = pod(status(0, terminated(T0, T0 + 5.4)))
    assert instance_of_line(ended, None, T0 + 15.2) is None
    waiting = pod(status(1, {"waiting": {"reason": "CrashLoopBackOff"}}, terminated(T0, T0 + 5)))
    assert instance_of_line(waiting, None, T0 + 15.2) is None


def test_a_line_in_the_second_a_container_ended_is_named_but_not_sure() -> None:
    ended = pod(status(0, terminated(T0, T0 + 5.4)))
    assert instance_of_line(ended, None, T0 + 5.6) == (0, False)
    assert instance_of_line(ended, None, T0 + 4.9) == (0, True)
    waiting = pod(status(1, {"waiting": {"reason": "CrashLoopBackOff"}}, terminated(T0, T0 + 5)))
    assert instance_of_line(waiting, None, T0 + 5.6) == (0, False)
    assert instance_of_line(waiting, None, T0 + 4.9) == (0, True)


def test_a_line_of_the_container_before_the_running_one_is_that_one_s() -> None:
    view = pod(status(3, running(T0 + 10), terminated(T0, T0 + 5.4)))
    assert instance_of_line(view, None, T0 + 5.2) == (2, True)
    assert instance_of_line(view, None, T0 + 5.7) == (2, True)  # the next one started at 10


def test_other_containers_restarts_count_and_a_missing_container_names_nothing() -> None:
    view = pod(status(2, running(T0 + 10)), status(4, running(T0), name="sidecar"))
    assert restart_total(view) == 6
    assert instance_of_line(view, "pytorch", T0 + 11) == (6, True)
    assert instance_of_line(view, "trainer", T0 + 11) is None
    assert instance_of_line(view, None, T0 + 11) is None  # two containers, none named
    assert instance_of_line(pod(), None, T0) is None
