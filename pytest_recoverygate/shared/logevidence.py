"""Evidence from log lines read by the drill itself, for a job whose image lacks the reporter.

The preferred way matches a job's lines inside its own processes (the reporter's start-up
hook, :mod:`recoverygate.evidence`). Where the reporter cannot be installed in the image,
a backend that reads the job's log (Kubernetes: the reporting rank's pod log) hands each
line to :class:`LogEvidence`, which runs the same matcher and writes the RECOVERYGATE/v1
lines the hook would have written, for the shared parser.

What that evidence lacks (:data:`LACKS`, said in every such drill's notes): the process
identity -- an incarnation is a log stream and its container restart count, so a restart
inside the container (torchrun restarting its group) is not a new incarnation; the
emitter's clock -- each event is stamped with the log's receive time; and every rank the
drill does not read.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from recoverygate import wire
from recoverygate.evidence import Matcher, Spec, strip_relay

__all__ = ["LACKS", "LogEvidence"]

LACKS = (
    "evidence read from the pod log by the drill (evidence.podLogs), not in the job's "
    "processes: an incarnation is a pod and its container restarts, so a restart inside "
    "the container (torchrun restarting its group) is not seen as one; events carry the "
    "log's receive time; only the reporting rank's pod is read, so the other ranks' loads "
    "are unchecked. Install recoverygate-reporter in the image to lift these limits"
)

_EVENTS = {
    "progress": wire.PROGRESS,
    "checkpointStarted": wire.CHECKPOINT_STARTED,
    "checkpointCompleted": wire.CHECKPOINT_COMPLETED,
    "checkpointLoaded": wire.CHECKPOINT_LOADED,
}


@dataclass
class _Stream:
    inc: str
    matcher: Matcher
    started: bool = False


class LogEvidence:
    """Log lines in, RECOVERYGATE/v1 lines out, one incarnation per (stream, restarts).

    Every match is written: the drill has read the line already, so a rate limit would save
    nothing (and would drop the replayed steps ``expectations.replay`` compares)."""

    def __init__(self, spec: Spec, *, rank: int) -> None:
        self.spec = spec
        self.rank = rank
        self._streams: dict[str, _Stream] = {}

    def translate(self, key: str, host: str, line: bytes, received: float) -> bytes:
        """The wire lines one log line proves (empty when it proves nothing)."""
        stream = self._streams.get(key)
        if stream is None:
            inc = hashlib.blake2b(key.encode(), digest_size=8).hexdigest()
            stream = self._streams[key] = _Stream(inc, Matcher(self.spec))
        text, rank = strip_relay(line.decode("utf-8", "replace"))
        if rank is not None and rank != self.rank:
            return b""  # another local rank's line, relayed by torchrun in this pod
        out = []
        for kind, step, loss in stream.matcher.feed(text):
            if not stream.started:
                stream.started = True
                out.append(
                    wire.format_start(received, stream.inc, pid=0, host=host, rank=self.rank)
                )
            printed = stream.matcher.loss_text if loss is not None else None
            out.append(
                wire.format_step(
                    _EVENTS[kind],
                    received,
                    stream.inc,
                    step,
                    self.rank,
                    loss=loss,
                    loss_decimals=wire.printed_decimals(printed) if printed else None,
                )
            )
        return "".join(out).encode("ascii")
