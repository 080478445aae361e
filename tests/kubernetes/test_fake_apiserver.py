"""The fake API server checked against the real client.

Why a fake at all: the tests that use it need what the real API server (the session's
cluster, tests/kubernetes/kube_cluster.py) cannot be made to do on cue: answer one chosen
request with a 429 or a 500, reset a connection before or after acting, drop a watch or
end it with 410 Gone, cut a log stream, and keep a log of every request it got. Those
tests are only as good as the fake's fidelity, so these tests pin the wire behaviour the
adapter relies on there: typed deserialisation by the real client (fields the client
requires are present), equality selectors, watch resume / bookmarks / timeoutSeconds /
410 as an ERROR event, delete preconditions and finalizers, pods/log options and errors,
fault injection (including the stream faults of the reliability suite: a 410 mid-watch, a
log backlog replayed backwards and cut after it), handlers that end when the client hangs
up, and the request log.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest

from tests.kubernetes.fake_apiserver import FakeApiServer, Fault, parse_selector, selector_matches
from tests.kubernetes.fake_cluster import NAMESPACE, FakeTrainingJob
from tests.patience import PROMPT, eventually

pytestmark = pytest.mark.kubernetes


def raw_lines(resp: Any) -> list[dict[str, Any]]:
    data = b"".join(resp.stream(amt=None, decode_content=False))
    return [json.loads(line) for line in data.splitlines() if line]


def running_pod(
    server: FakeApiServer, name: str = "p", labels: dict[str, str] | None = None
) -> dict[str, Any]:
    pod = server.create_pod(
        {"metadata": {"name": name, "namespace": NAMESPACE, "labels": labels or {"app": "x"}}}
    )
    server.start_container(NAMESPACE, name)
    return pod


# ---------------------------------------------------------------------- selectors


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("app=x", ["a", "b"]),
        ("app==x,tier!=web", ["b"]),
        ("tier!=db", ["a", "c"]),
        ("zone!=eu", ["a", "b", "c"]),
        ("app=x,tier=db,zone=eu", []),
    ],
)
def test_it_filters_by_equality_selectors(
    apiserver: FakeApiServer, core_api: Any, selector: str, expected: list[str]
) -> None:
    apiserver.create_pod(
        {"metadata": {"name": "a", "namespace": NAMESPACE, "labels": {"app": "x", "tier": "web"}}}
    )
    apiserver.create_pod(
        {"metadata": {"name": "b", "namespace": NAMESPACE, "labels": {"app": "x", "tier": "db"}}}
    )
    apiserver.create_pod(
        {"metadata": {"name": "c", "namespace": NAMESPACE, "labels": {"app": "y", "tier": "web"}}}
    )
    pods = core_api.list_namespaced_pod(NAMESPACE, label_selector=selector)
    assert sorted(p.metadata.name for p in pods.items) == expected


def test_it_rejects_a_malformed_selector_with_400(core_api: Any) -> None:
    from kubernetes.client.exceptions import ApiException

    with pytest.raises(ApiException) as info:
        core_api.list_namespaced_pod(NAMESPACE, label_selector="app in (x")
    assert info.value.status == 400
    assert json.loads(info.value.body or "{}")["reason"] == "BadRequest"


def test_selector_parsing_matches_the_apiserver_equality_grammar() -> None:
    requirements = parse_selector("a == 1, b!=3,c=")
    assert selector_matches(requirements, {"a": "1", "c": ""})
    assert not selector_matches(requirements, {"a": "1", "b": "3", "c": ""})
    with pytest.raises(ValueError):  # set-based: the fake has no test that needs it
        parse_selector("a in (1,2)")


# ---------------------------------------------------------------------- typed objects


def test_the_real_client_deserialises_every_pod_the_helpers_make(
    apiserver: FakeApiServer, core_api: Any
) -> None:
    FakeTrainingJob(apiserver, kind="trainjob", nodes=2).start().stop()
    FakeTrainingJob(apiserver, kind="pytorchjob", nodes=2).start().stop()
    pods = core_api.list_namespaced_pod(NAMESPACE).items
    assert len(pods) == 4
    assert all(p.status.container_statuses[0].state.running is not None for p in pods)
    assert all(p.metadata.uid and p.metadata.resource_version for p in pods)


# ---------------------------------------------------------------------- watch


def test_a_watch_resumes_from_a_resource_version_and_ends_after_timeout_seconds(
    apiserver: FakeApiServer, core_api: Any
) -> None:
    running_pod(apiserver, "a")
    listed = core_api.list_namespaced_pod(NAMESPACE)
    apiserver.set_phase(NAMESPACE, "a", "Succeeded")
    timeout = 1  # not a wait: the watch's timeoutSeconds under test
    resp = core_api.list_namespaced_pod(
        NAMESPACE,
        watch=True,
        resource_version=listed.metadata.resource_version,
        timeout_seconds=timeout,
        _preload_content=False,
    )
    events = raw_lines(resp)
    # the server's own log: the watch ended once its timeoutSeconds had passed
    [watch] = [r for r in apiserver.requests if r.verb == "watch"]
    # the client reads the last chunk before the server's handler returns and logs it
    eventually(lambda: watch.finished is not None, "the watch's handler to return", PROMPT)
    assert watch.finished is not None and watch.finished - watch.time >= timeout, watch
    assert [(e["type"], e["object"]["status"]["phase"]) for e in events] == [
        ("MODIFIED", "Succeeded")
    ]


def test_a_watch_sends_bookmarks_only_when_allowed(apiserver: FakeApiServer, core_api: Any) -> None:
    apiserver.bookmark_interval = 0.2
    rv = core_api.list_namespaced_pod(NAMESPACE).metadata.resource_version
    with_bookmarks = raw_lines(
        core_api.list_namespaced_pod(
            NAMESPACE,
            watch=True,
            resource_version=rv,
            timeout_seconds=1,
            allow_watch_bookmarks=True,
            _preload_content=False,
        )
    )
    without = raw_lines(
        core_api.list_namespaced_pod(
            NAMESPACE, watch=True, resource_version=rv, timeout_seconds=1, _preload_content=False
        )
    )
    assert with_bookmarks
    assert {e["type"] for e in with_bookmarks} == {"BOOKMARK"}
    assert with_bookmarks[-1]["object"]["metadata"]["resourceVersion"] == str(
        apiserver.resource_version
    )
    assert without == []


def test_an_expired_resource_version_gets_200_then_an_error_event_with_410(
    apiserver: FakeApiServer, core_api: Any
) -> None:
    from kubernetes import watch
    from kubernetes.client.exceptions import ApiException

    running_pod(apiserver, "a")
    old = core_api.list_namespaced_pod(NAMESPACE).metadata.resource_version
    apiserver.set_phase(NAMESPACE, "a", "Succeeded")
    apiserver.compact()
    resp = core_api.list_namespaced_pod(
        NAMESPACE, watch=True, resource_version=old, timeout_seconds=5, _preload_content=False
    )
    assert resp.status == 200
    events = raw_lines(resp)
    assert events[0]["type"] == "ERROR"
    assert events[0]["object"]["code"] == 410
    assert events[0]["object"]["reason"] == "Expired"
    # the client's own Watch turns it into ApiException(410) and does not re-list
    with pytest.raises(ApiException) as info:
        list(
            watch.Watch().stream(
                core_api.list_namespaced_pod, NAMESPACE, resource_version=old, timeout_seconds=5
            )
        )
    assert info.value.status == 410


# ---------------------------------------------------------------------- delete


def test_a_grace_zero_delete_is_modified_then_deleted(
    apiserver: FakeApiServer, core_api: Any
) -> None:
    from kubernetes import client

    pod = running_pod(apiserver, "a")
    rv = core_api.list_namespaced_pod(NAMESPACE).metadata.resource_version
    body = client.V1DeleteOptions(
        grace_period_seconds=0, preconditions=client.V1Preconditions(uid=pod["metadata"]["uid"])
    )
    core_api.delete_namespaced_pod("a", NAMESPACE, body=body)
    events = raw_lines(
        core_api.list_namespaced_pod(
            NAMESPACE, watch=True, resource_version=rv, timeout_seconds=1, _preload_content=False
        )
    )
    assert [e["type"] for e in events] == ["MODIFIED", "DELETED"]
    assert events[0]["object"]["metadata"]["deletionGracePeriodSeconds"] == 0
    assert apiserver.get_pod(NAMESPACE, "a") is None


def test_a_wrong_uid_precondition_gets_409_and_deletes_nothing(
    apiserver: FakeApiServer, core_api: Any
) -> None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    running_pod(apiserver, "a")
    body = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid="someone-else"))
    with pytest.raises(ApiException) as info:
        core_api.delete_namespaced_pod("a", NAMESPACE, body=body)
    assert info.value.status == 409
    assert (
        "Precondition failed: UID in precondition: someone-else"
        in json.loads(info.value.body or "{}")["message"]
    )
    assert apiserver.get_pod(NAMESPACE, "a") is not None
    assert [r.acted for r in apiserver.deletes()] == [False]


def test_a_finalizer_keeps_a_deleted_pod_terminating_until_removed(
    apiserver: FakeApiServer, core_api: Any
) -> None:
    apiserver.create_pod(
        {
            "metadata": {
                "name": "f",
                "namespace": NAMESPACE,
                "finalizers": ["batch.kubernetes.io/job-tracking"],
            }
        }
    )
    core_api.delete_namespaced_pod("f", NAMESPACE, grace_period_seconds=0)
    pod = apiserver.get_pod(NAMESPACE, "f")
    assert pod is not None and pod["metadata"]["deletionTimestamp"]
    apiserver.remove_finalizers(NAMESPACE, "f")
    assert apiserver.get_pod(NAMESPACE, "f") is None


def test_a_dry_run_delete_is_answered_but_changes_nothing(
    apiserver: FakeApiServer, core_api: Any
) -> None:
    running_pod(apiserver, "a")
    answer = core_api.delete_namespaced_pod("a", NAMESPACE, dry_run="All", grace_period_seconds=0)
    assert answer.metadata.deletion_timestamp is not None
    assert apiserver.get_pod(NAMESPACE, "a")["metadata"].get("deletionTimestamp") is None  # type: ignore[index]
    assert [(r.dry_run, r.acted) for r in apiserver.deletes()] == [(True, False)]


def test_a_delete_with_a_body_ignores_the_dry_run_of_its_query(
    apiserver: FakeApiServer, core_api: Any
) -> None:
    """As the real apiserver does (k8s.io/apiserver handlers/delete.go, and
    tests/kubernetes/test_kube_cluster.py on the real one): the options of a DELETE come
    from its body when it has one, and the query is not read at all."""
    from kubernetes import client

    running_pod(apiserver, "a")
    body = client.V1DeleteOptions(grace_period_seconds=0)
    core_api.delete_namespaced_pod("a", NAMESPACE, body=body, dry_run="All")
    assert apiserver.get_pod(NAMESPACE, "a") is None
    assert [(r.dry_run, r.acted) for r in apiserver.deletes()] == [(False, True)]


# ---------------------------------------------------------------------- logs


def test_logs_have_kubelet_timestamps_with_nine_fractional_digits(
    apiserver: FakeApiServer, core_api: Any
) -> None:
    running_pod(apiserver, "a")
    apiserver.append_log(NAMESPACE, "a", "hello", ts=1764423434.5)
    text = core_api.read_namespaced_pod_log("a", NAMESPACE, timestamps=True)
    assert text == "2025-11-29T13:37:14.500000000Z hello\n"


def test_since_seconds_selects_lines_and_a_restart_starts_a_new_log(
    apiserver: FakeApiServer, core_api: Any
) -> None:
    running_pod(apiserver, "a")
    apiserver.append_log(NAMESPACE, "a", "old", ts=time.time() - 100)
    apiserver.append_log(NAMESPACE, "a", "new")
    apiserver.append_log(NAMESPACE, "a", "newer")
    assert core_api.read_namespaced_pod_log("a", NAMESPACE, since_seconds=10) == "new\nnewer\n"
    apiserver.stop_container(NAMESPACE, "a", exit_code=1)
    apiserver.start_container(NAMESPACE, "a")
    apiserver.append_log(NAMESPACE, "a", "second life")
    assert core_api.read_namespaced_pod_log("a", NAMESPACE) == "second life\n"


def test_a_pending_container_answers_400_waiting_to_start(
    apiserver: FakeApiServer, core_api: Any
) -> None:
    from kubernetes.client.exceptions import ApiException

    apiserver.create_pod({"metadata": {"name": "w", "namespace": NAMESPACE}})
    with pytest.raises(ApiException) as info:
        core_api.read_namespaced_pod_log("w", NAMESPACE, follow=True)
    assert info.value.status == 400
    message = json.loads(info.value.body or "{}")["message"]
    assert message == 'container "main" in pod "w" is waiting to start: ContainerCreating'


def sent(server: FakeApiServer) -> int:
    """The server's own log: the lines its followed log request has sent so far."""
    follows = [r for r in server.requests if r.resource == "pods/log"]
    return follows[-1].lines_sent if follows else 0


def test_a_followed_log_ends_when_the_container_stops(
    apiserver: FakeApiServer, core_api: Any
) -> None:
    running_pod(apiserver, "a")
    apiserver.append_log(NAMESPACE, "a", "one")

    def later() -> None:
        try:
            eventually(lambda: sent(apiserver) >= 1, "the log followed", PROMPT)
        finally:  # the stream ends either way: a failed wait fails the assert below
            apiserver.append_log(NAMESPACE, "a", "two")
            apiserver.stop_container(NAMESPACE, "a")

    threading.Thread(target=later).start()
    resp = core_api.read_namespaced_pod_log("a", NAMESPACE, follow=True, _preload_content=False)
    assert b"".join(resp.stream(amt=None, decode_content=False)) == b"one\ntwo\n"


# ---------------------------------------------------------------------- faults, RBAC, the log


@pytest.mark.parametrize("code", [403, 404, 409, 429, 500])
def test_injected_status_faults_carry_a_status_body(
    apiserver: FakeApiServer, core_api: Any, code: int
) -> None:
    from kubernetes.client.exceptions import ApiException

    apiserver.fault_hook = lambda info: Fault(status=code, retry_after=1)
    with pytest.raises(ApiException) as info:
        core_api.list_namespaced_pod(NAMESPACE)
    assert info.value.status == code
    body = json.loads(info.value.body or "{}")
    assert (body["kind"], body["code"], body["status"]) == ("Status", code, "Failure")
    assert info.value.headers is not None and info.value.headers["Retry-After"] == "1"


def test_a_reset_after_acting_deletes_but_never_answers(
    apiserver: FakeApiServer, core_api: Any
) -> None:
    import copy

    from kubernetes import client
    from urllib3.exceptions import HTTPError

    running_pod(apiserver, "a")
    configuration = copy.deepcopy(core_api.api_client.configuration)
    configuration.retries = False
    no_retries = client.CoreV1Api(client.ApiClient(configuration))
    apiserver.fault_hook = lambda info: Fault(reset_after=True) if info.method == "DELETE" else None
    with pytest.raises((HTTPError, OSError)):
        no_retries.delete_namespaced_pod("a", NAMESPACE, grace_period_seconds=0)
    assert apiserver.get_pod(NAMESPACE, "a") is None
    assert [(r.status, r.acted) for r in apiserver.deletes()] == [(None, True)]


def test_a_watch_fault_ends_the_stream_with_a_410_error_event_after_k_events(
    apiserver: FakeApiServer, core_api: Any
) -> None:
    rv = core_api.list_namespaced_pod(NAMESPACE).metadata.resource_version
    for name in ("a", "b", "c"):
        running_pod(apiserver, name)
    apiserver.fault_hook = lambda info: Fault(expire_after_lines=2)
    resp = core_api.list_namespaced_pod(
        NAMESPACE, watch=True, resource_version=rv, timeout_seconds=5, _preload_content=False
    )
    events = raw_lines(resp)  # the stream ends cleanly after the ERROR event
    assert [e["type"] for e in events] == ["ADDED", "MODIFIED", "ERROR"]
    assert (events[-1]["object"]["code"], events[-1]["object"]["reason"]) == (410, "Expired")


def test_a_log_fault_replays_the_backlog_backwards_and_cuts_k_lines_after_it(
    apiserver: FakeApiServer, core_api: Any
) -> None:
    from urllib3.exceptions import HTTPError

    running_pod(apiserver, "a")
    for text in ("one", "two", "three"):
        apiserver.append_log(NAMESPACE, "a", text)
    apiserver.fault_hook = lambda info: Fault(drop_after_new_lines=1, replay_backwards=2)

    def later() -> None:
        try:  # the backlog (three lines and two replayed) went out: the rest is new
            eventually(lambda: sent(apiserver) >= 5, "the backlog sent", PROMPT)
        finally:
            apiserver.append_log(NAMESPACE, "a", "four")
            apiserver.append_log(NAMESPACE, "a", "five")

    threading.Thread(target=later).start()
    resp = core_api.read_namespaced_pod_log("a", NAMESPACE, follow=True, _preload_content=False)
    chunks: list[bytes] = []

    def read_all() -> None:
        chunks.extend(resp.stream(amt=None, decode_content=False))

    with pytest.raises((HTTPError, OSError)):  # the cut: a reset, not a clean end
        read_all()
    assert b"".join(chunks).splitlines() == [b"one", b"two", b"three", b"three", b"two", b"four"]


@pytest.mark.parametrize("stream", ["watch", "log"])
def test_a_silent_stream_ends_on_the_server_once_the_client_hangs_up(
    apiserver: FakeApiServer, core_api: Any, stream: str
) -> None:
    running_pod(apiserver, "a")
    if stream == "watch":
        resp = core_api.list_namespaced_pod(
            NAMESPACE, watch=True, timeout_seconds=3600, _preload_content=False
        )
    else:
        resp = core_api.read_namespaced_pod_log("a", NAMESPACE, follow=True, _preload_content=False)
    eventually(lambda: len(apiserver._connections) == 1, "the stream's connection", PROMPT)
    resp.close()  # closes the connection: the server sees the client's FIN
    eventually(lambda: not apiserver._connections, "the handler to stop waiting", PROMPT)


def test_urllib3_by_default_resends_a_delete_after_a_connection_reset(
    apiserver: FakeApiServer, core_api: Any
) -> None:
    """The other reason for ``retries = False``: a reset DELETE is re-sent blindly."""
    running_pod(apiserver, "a")
    faults = iter([Fault(reset_before=True)])
    apiserver.fault_hook = lambda info: next(faults, None) if info.method == "DELETE" else None
    core_api.delete_namespaced_pod("a", NAMESPACE, grace_period_seconds=0)
    assert [r.status for r in apiserver.deletes()] == [None, 200]


def test_urllib3_by_default_resends_a_delete_on_429_with_retry_after(
    apiserver: FakeApiServer, core_api: Any
) -> None:
    """Why the adapter sets ``Configuration.retries = False``: the default re-sends DELETEs."""
    running_pod(apiserver, "a")
    faults = iter([Fault(status=429, retry_after=0)])
    apiserver.fault_hook = lambda info: next(faults, None) if info.method == "DELETE" else None
    core_api.delete_namespaced_pod("a", NAMESPACE, grace_period_seconds=0)
    assert [r.status for r in apiserver.deletes()] == [429, 200]


def test_the_rbac_allow_list_answers_403_like_the_apiserver(
    apiserver: FakeApiServer, core_api: Any
) -> None:
    from kubernetes.client.exceptions import ApiException

    running_pod(apiserver, "a")
    apiserver.allowed = frozenset({("list", "pods")})
    core_api.list_namespaced_pod(NAMESPACE)
    with pytest.raises(ApiException) as info:
        core_api.delete_namespaced_pod("a", NAMESPACE)
    assert info.value.status == 403
    message = json.loads(info.value.body or "{}")["message"]
    assert 'cannot delete resource "pods" in API group "" in the namespace "training"' in message
    assert [(r.verb, r.resource, r.status) for r in apiserver.requests] == [
        ("list", "pods", 200),
        ("delete", "pods", 403),
    ]
