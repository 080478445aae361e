"""The log stream: the reporting rank's pod log, followed into training events.

A background thread follows the log of the pod that holds the reporting rank, with
kubelet timestamps, and feeds each line to the shared
:class:`~pytest_recoverygate.shared.events.StreamEventSource` with the *kubelet's* time as the
receive time, so recovery time excludes streaming delay. The stream ends when the
container stops; it is reopened on whichever pod now holds that rank (400 "waiting to
start" while it is Pending is retried), from ``sinceSeconds`` covering the gap, and lines
already seen are dropped (:class:`SeenLines`: a pod's log is in kubelet-time order, so
a line older than the newest one seen of that pod was seen, and one at that very
nanosecond is told apart by its digest: bounded memory and O(1) per line, whatever the
overlap or the line lengths). What the followed pods printed is kept per pod for the
report (:meth:`LogStream.job_output`).

The log is the job's text: a line is held for at most
:data:`~pytest_recoverygate.shared.textbounds.MAX_LINE_BYTES` bytes before its newline; a
longer one is handed on cut there (the rest dropped up to its newline), counted in
:attr:`LogStream.truncated_lines` and marked in the kept log.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from datetime import datetime, timezone
from typing import Any

from pytest_recoverygate.engine.model import TrainingEvent
from pytest_recoverygate.orchestrators.kubernetes.api import ApiSession, is_transient, iter_lines
from pytest_recoverygate.orchestrators.kubernetes.pods import (
    Pod,
    instance_of_line,
    pick_container,
    pod_name,
    pod_uid,
    restart_total,
)
from pytest_recoverygate.shared.events import StreamEventSource
from pytest_recoverygate.shared.joboutput import JobOutput, OutputSplitter
from pytest_recoverygate.shared.logevidence import LogEvidence
from pytest_recoverygate.shared.textbounds import MAX_LINE_BYTES, CutLine, LineSplitter

__all__ = ["LogStream", "PodLogEvents", "SeenLines", "kubelet_ns", "parse_kubelet_timestamp"]

_LOG_DEDUPE_WINDOW = 600.0  # a line this much older than the newest one seen is dropped
#: evidence.podLogs: how long a log's first new line waits for the pod's status to show
#: the container instance that printed it (the kubelet posts it on its own schedule)
STATUS_LAG_LIMIT = 30.0
#: ... and for a status that may show it, or the next instance (see instance_of_line)
STATUS_UNSURE_LIMIT = 3.0


def parse_kubelet_timestamp(text: str) -> float:
    """``2026-11-29T11:47:14.123456789Z`` as POSIX seconds (ValueError when malformed)."""
    if not text.endswith("Z") or len(text) < 20:
        raise ValueError(text)
    base = datetime.strptime(text[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc)
    fraction = text[20:-1] if len(text) > 20 and text[19] == "." else ""
    if fraction and not fraction.isdigit():
        raise ValueError(text)
    return base.timestamp() + (int(fraction) / 10 ** len(fraction) if fraction else 0.0)


def kubelet_ns(text: str) -> int:
    """``2026-11-29T11:47:14.123456789Z`` as integer nanoseconds since the epoch (exact:
    kubelet trims trailing zeros, and a float cannot hold nanoseconds); ValueError when
    malformed."""
    if not text.endswith("Z") or len(text) < 20:
        raise ValueError(text)
    base = datetime.strptime(text[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc)
    fraction = text[20:-1] if len(text) > 20 and text[19] == "." else ""
    if fraction and (not fraction.isdigit() or len(fraction) > 9):
        raise ValueError(text)
    return int(base.timestamp()) * 1_000_000_000 + int(fraction.ljust(9, "0") or 0)


class SeenLines:
    """Which log lines were already delivered, per stream (one followed pod), in bounded
    memory and O(1) per line.

    A container's log is in kubelet-time order, and a reopened stream (``sinceSeconds``)
    replays its lines in that order. So per stream the newest timestamp seen is kept, and
    the digests of the lines at exactly that nanosecond: a line older than it was seen; a
    line at it was seen if its digest was; a newer line is new. Lines without a timestamp
    (malformed) are remembered by digest, the last :data:`MAX_UNSTAMPED` of them.
    """

    #: digests kept of the lines sharing a stream's newest timestamp
    MAX_AT_TOP = 1024
    #: streams remembered (the pods a drill followed: the newest ones)
    MAX_STREAMS = 64
    #: digests kept of lines without a timestamp
    MAX_UNSTAMPED = 1024

    def __init__(self) -> None:
        self._top: OrderedDict[Hashable, tuple[int, dict[bytes, None]]] = OrderedDict()
        self._unstamped: OrderedDict[bytes, None] = OrderedDict()

    @staticmethod
    def _digest(content: bytes) -> bytes:
        return hashlib.blake2b(content, digest_size=16).digest()

    def first_time(self, stream: Hashable, stamp: int | None, content: bytes) -> bool:
        """Whether this line of ``stream`` is new (it is then remembered)."""
        digest = self._digest(content)
        if stamp is None:
            if digest in self._unstamped:
                return False
            self._unstamped[digest] = None
            if len(self._unstamped) > self.MAX_UNSTAMPED:
                self._unstamped.popitem(last=False)
            return True
        top = self._top.get(stream)
        if top is not None and stamp < top[0]:
            return False
        if top is not None and stamp == top[0]:
            at_top = top[1]
            if digest in at_top:
                return False
            at_top[digest] = None
            if len(at_top) > self.MAX_AT_TOP:
                del at_top[next(iter(at_top))]
            return True
        self._top[stream] = (stamp, {digest: None})
        self._top.move_to_end(stream)
        if len(self._top) > self.MAX_STREAMS:
            self._top.popitem(last=False)
        return True

    def size(self) -> int:
        """Digests held: at most MAX_STREAMS x MAX_AT_TOP + MAX_UNSTAMPED."""
        return sum(len(d) for _, d in self._top.values()) + len(self._unstamped)


class PodLogEvents:
    """The adapter's EventSource: the shared parser, plus the threads' fatal errors (of
    every session given: one per replica group shares one parser, a 403 on any log
    raised)."""

    def __init__(self, source: StreamEventSource, *sessions: ApiSession) -> None:
        self._source = source
        self._sessions = sessions

    def poll(self) -> list[TrainingEvent]:
        for session in self._sessions:
            session.raise_fatal()
        return self._source.poll()

    @property
    def malformed_lines(self) -> int:
        return self._source.malformed_lines

    def close(self) -> None:
        self._source.close()


class LogStream:
    """Follows the pod that ``reporting_pod()`` names, reopening on each replacement."""

    def __init__(
        self,
        session: ApiSession,
        *,
        reporting_rank: int,
        container: str | None,
        reporting_pod: Callable[[], Pod | None],
        source: StreamEventSource | None = None,
    ) -> None:
        self._session = session
        self._clock = session.clock
        self.reporting_rank = reporting_rank
        self.container = container
        self._reporting_pod = reporting_pod
        # ``source``: one shared by several streams (the replica groups of a live drill)
        self.source = source or StreamEventSource(wakeup=self._clock.wakeup, clock=self._clock.now)
        self.events = PodLogEvents(self.source, session)
        self._seen = SeenLines()
        self._last_log_time: float | None = None
        self._fresh = 0  # new lines the current stream delivered so far
        # the followed pods' logs, per pod (a replacement with the pod's name shares its file)
        self._output = OutputSplitter(lambda line: None, default="pod log")
        self._labels: dict[Any, str] = {}
        self.max_line = MAX_LINE_BYTES
        #: Log lines longer than ``max_line`` bytes, cut there (the rest was not read).
        self.truncated_lines = 0
        #: evidence.podLogs: the drill matches the log's lines itself (logevidence.py)
        self.evidence: LogEvidence | None = None
        self._incarnation = ""  # the followed pod and its container restarts
        self._unresolved: tuple[Any, Pod] | None = None  # (api, pod): instance not known yet
        self._host = ""

    def run(self) -> None:
        """The thread: follow the reporting pod's log until cleanup."""
        from kubernetes.client.exceptions import ApiException

        session, stop = self._session, self._session.stop
        api = session.new_api()
        failures = 0
        while not stop.is_set():
            pod = self._reporting_pod()
            if pod is None:
                failures += 1
                stop.wait(min(0.05 * 2**failures, 1.0))
                continue
            try:
                fresh = self._follow(api, pod)
                failures = 0 if fresh else failures + 1
                if not fresh:
                    stop.wait(min(0.05 * 2**failures, 1.0))
            except ApiException as exc:
                if exc.status == 403:
                    session.set_fatal(session.forbidden("get", "pods/log", exc))
                    return
                # 400 "waiting to start" (Pending replacement), 404 (pod just replaced), 429, 5xx
                failures += 1
                stop.wait(session.retry.wait(min(failures, 5), exc))
            except Exception as exc:
                if stop.is_set():
                    return
                # A stream cut after it delivered new lines was no failure: reopen soon, or
                # a stream cut every few lines would lag further behind with each cut.
                failures = 1 if self._fresh else failures + 1
                stop.wait(session.retry.wait(min(failures, 5), exc if is_transient(exc) else None))

    def _follow(self, api: Any, pod: Pod) -> int:
        """Follow one pod's log until it ends; returns how many new lines arrived."""
        session = self._session
        since = None
        if self._last_log_time is not None:
            since = max(1, math.ceil(self._clock.now() - self._last_log_time + 5))
        kwargs: dict[str, Any] = {
            "follow": True,
            "timestamps": True,
            "_preload_content": False,
            "_request_timeout": (5, max(session.request_timeout, 300.0)),
        }
        container = pick_container(pod, self.container)
        if container:
            kwargs["container"] = container
        if since is not None:
            kwargs["since_seconds"] = since
        resp = api.read_namespaced_pod_log(pod_name(pod), session.namespace, **kwargs)
        self._fresh = 0
        stream = ("pod-log", pod_uid(pod))
        self._incarnation = f"{pod_uid(pod)}/{restart_total(pod)}"
        self._host = pod_name(pod)
        label = f"pod {pod_name(pod)}"
        if stream not in self._labels:
            if label in self._labels.values():  # PyTorchJob reuses the name
                self._output.feed(
                    f"[recoverygate: pod {pod_name(pod)} was replaced; this is the log of "
                    f"uid {pod_uid(pod)}]\n".encode(),
                    label=label,
                )
            self._labels[stream] = label
        splitter = LineSplitter(self.max_line)
        with session.tracked(resp):
            if self.evidence is not None:
                self._unresolved = (api, pod)  # resolved at the first new line
            for line in iter_lines(resp, splitter):
                if self._feed_line(line, stream):
                    self._fresh += 1
                    if isinstance(line, CutLine):
                        self._mark_cut(stream)
                if session.stop.is_set():
                    break
        self.source.end_stream(stream)
        return self._fresh

    def _incarnation_of(self, api: Any, pod: Pod, when: float) -> str:
        """``evidence.podLogs``: the container instance that printed the first new line of
        a log just opened (stamped ``when``), from fresh lists of the pods.

        Neither the watch's view of the pod nor a list made when the log is opened need
        show the container restart whose log this is: the kubelet serves the new
        container's lines before it posts the pod's status (seen in full runs: the new
        container's lines were taken for the old one's, and the drill said "never came
        back"). So the pods are listed again until the status shows the instance that ran
        at ``when`` (:func:`instance_of_line`), for at most :data:`STATUS_LAG_LIMIT`
        seconds (:data:`STATUS_UNSURE_LIMIT` when the status may show it); after that the
        newest instance the status shows is taken.
        """
        uid, container = pod_uid(pod), pick_container(pod, self.container)
        stop, began = self._session.stop, time.monotonic()  # real waits, on any clock
        deadline = self._clock.now() + STATUS_LAG_LIMIT
        current = pod
        while True:
            pods, _ = self._session.list_pods(api, deadline=deadline)
            current = next((p for p in pods if pod_uid(p) == uid), current)
            found = instance_of_line(current, container, when)
            waited = time.monotonic() - began
            if found is not None and (found[1] or waited >= STATUS_UNSURE_LIMIT):
                return f"{uid}/{found[0]}"
            if stop.is_set() or waited >= STATUS_LAG_LIMIT:
                return f"{uid}/{restart_total(current)}"
            stop.wait(0.2)

    def _feed_line(self, line: bytes, stream: Any) -> bool:
        """Parse the kubelet timestamp, drop lines seen before, feed the rest."""
        stamp, _, content = line.partition(b" ")
        ns: int | None
        try:
            ns = kubelet_ns(stamp.decode("ascii"))
            received = ns / 1e9
        except (UnicodeDecodeError, ValueError):
            ns, received, content = None, self._clock.now(), line
        last = self._last_log_time
        if ns is not None and last is not None and received < last - _LOG_DEDUPE_WINDOW:
            return False
        if not self._seen.first_time(stream, ns, content):
            return False
        if last is None or received > last:
            self._last_log_time = received
        if self.evidence is not None:
            if self._unresolved is not None:
                api, pod = self._unresolved
                self._unresolved = None
                self._incarnation = self._incarnation_of(api, pod, received)
            events = self.evidence.translate(self._incarnation, self._host, content, received)
            if events:
                self.source.feed(events, received, stream=stream)
        self.source.feed(content + b"\n", received, stream=stream)
        self._output.feed(content + b"\n", stream, label=self._labels.get(stream))
        return True

    def _mark_cut(self, stream: Any) -> None:
        self.truncated_lines += 1
        self._output.feed(
            f"[recoverygate: the line above was longer than {self.max_line} bytes; it was "
            "cut there and the rest of it was not read]\n".encode(),
            stream,
            label=self._labels.get(stream),
        )

    @property
    def last_line_time(self) -> float | None:
        """The kubelet time of the newest line streamed so far (None: none yet)."""
        return self._last_log_time

    def job_output(self) -> JobOutput:
        """The logs of the reporting rank's pods the drill followed, one file per pod."""
        cut = (
            f"; {self.truncated_lines} line(s) longer than {self.max_line} bytes were cut"
            if self.truncated_lines
            else ""
        )
        return self._output.output(
            note=(
                f"the logs of the reporting rank's pods (rank {self.reporting_rank}), as the "
                "drill streamed them; other pods: kubectl logs POD (--previous for a "
                f"restarted container){cut}"
            )
        )
