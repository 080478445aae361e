"""Ray Train with the checkpoint events: ``report`` and ``get_checkpoint``, as Ray's own.

Drop-in wrappers of ``ray.train.report`` and ``ray.train.get_checkpoint``::

    from recoverygate.integrations import ray as rg

    checkpoint = rg.get_checkpoint()          # checkpoint_loaded(step) when there is one
    ...
    rg.report({"step": step, "loss": loss}, checkpoint=checkpoint)

- ``report(metrics, checkpoint=None, *, step=None, **kwargs)`` calls
  ``ray.train.report`` unchanged, then reports ``progress(step)``; with a checkpoint it
  reports ``checkpoint_completed(step)`` only once Ray's controller has *registered* the
  checkpoint (measured with Ray 2.60: up to 2 s after ``report()`` returns). A thread
  waits for that (``ray.train.get_all_reported_checkpoints(COMMITTED)``) so training is
  not held up; a kill inside that window resumes from the previous checkpoint, which is
  correct: ``resumeFromCheckpoint: latest`` means the latest one Ray registered. The step
  is ``step=``, else ``metrics["step"]``, else ``metrics["global_step"]``; it is stored in
  the checkpoint's metadata (``recoverygate_step``) so that a resume can say it.
  With a checkpoint it also reports ``checkpoint_started(step)`` before Ray's report
  (on every rank that reports a shard): the save runs from there (the upload, Ray's
  barrier, the registration) until ``checkpoint_completed``.
- ``get_checkpoint()`` returns ``ray.train.get_checkpoint()`` and, when it is a
  checkpoint, reports ``checkpoint_loaded(step)`` with the step from its metadata.
- ``sigterm_event()``: a ``threading.Event`` that a SIGTERM sets, for a job that saves
  when it is preempted. Ray's own handler ends a Train worker at once (exit code 1), and
  the train function runs on a thread of its own, where ``signal.signal`` cannot be
  called; this installs the handler on the worker's main thread, through its own actor
  (``RayTrainWorker.execute``), and waits until it is in place.

With ``RECOVERYGATE_AUTO=1`` (or ``ray`` in its list) the start-up hook patches both in
``ray.train`` itself (:mod:`recoverygate.integrations.auto`), so a stock Ray Train script
that reports ``{"step": ...}`` needs no line. Nothing here ever raises into training, and
Ray's own exceptions reach the caller as they would without the wrapper.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
from typing import Any

from recoverygate import reporter
from recoverygate.integrations import _common

__all__ = ["STEP_KEY", "get_checkpoint", "install", "report", "sigterm_event", "step_of"]

#: The checkpoint metadata key holding the step.
STEP_KEY = "recoverygate_step"
_MARK = "__recoverygate_original__"
_REGISTERED_TIMEOUT = 120.0  # seconds to wait for the controller to register a checkpoint

_SIGTERM = threading.Event()  # set by the handler sigterm_event() installs
_pending: dict[str, queue.Queue[int]] = {}  # "steps": the confirming thread's queue, once started
_queue_lock = threading.Lock()


def _train() -> Any:
    return sys.modules.get("ray.train") or __import__("ray.train").train


def _original(name: str) -> Any:
    fn = getattr(_train(), name)
    return getattr(fn, _MARK, fn)


def step_of(metrics: Any, step: Any = None) -> int | None:
    """The step of a report: ``step``, else ``metrics["step"]``, else ``metrics["global_step"]``."""
    if step is None and isinstance(metrics, dict):
        step = metrics.get("step", metrics.get("global_step"))
    try:
        return int(step) if step is not None else None
    except (TypeError, ValueError):
        return None


@_common.safe("ray: rank")
def _rank_known() -> None:
    """The reporter reads ``RANK``; Train sets it for torch, else ask Train's context."""
    if "RANK" not in os.environ:
        context = _train().get_context()
        os.environ["RANK"] = str(int(context.get_world_rank()))


@_common.safe("ray: checkpoint metadata")
def _tag(checkpoint: Any, step: int) -> None:
    metadata = dict(checkpoint.get_metadata() or {})
    metadata[STEP_KEY] = step
    checkpoint.set_metadata(metadata)


def _registered(step: int) -> bool:
    """Block until the controller has registered every report so far; was ``step``'s there?"""
    train = _train()
    mode = getattr(train, "CheckpointConsistencyMode", None)
    kwargs: dict[str, Any] = {"timeout_s": _REGISTERED_TIMEOUT}
    if mode is not None:
        kwargs["consistency_mode"] = mode.COMMITTED
    for reported in train.get_all_reported_checkpoints(**kwargs):
        if step_of(getattr(reported, "metrics", None)) == step:
            return True
        checkpoint = getattr(reported, "checkpoint", None)
        meta = checkpoint.get_metadata() if checkpoint is not None else {}
        if isinstance(meta, dict) and step_of(None, meta.get(STEP_KEY)) == step:
            return True
    return False


def _confirm_loop(pending: queue.Queue[int]) -> None:
    while True:
        step = pending.get()
        try:
            if _registered(step):
                reporter.checkpoint_completed(step)
        except Exception as error:  # never into training; the checkpoint is just not reported
            _common.warn_once("ray: checkpoint registration not confirmed", error)


def _confirm_later(step: int) -> None:
    with _queue_lock:
        pending = _pending.get("steps")
        if pending is None:
            pending = _pending["steps"] = queue.Queue()
            threading.Thread(
                target=_confirm_loop, args=(pending,), name="recoverygate-ray", daemon=True
            ).start()
        pending.put(step)


def report(
    metrics: Any, checkpoint: Any = None, *args: Any, step: Any = None, **kwargs: Any
) -> Any:
    """``ray.train.report`` plus progress, and checkpoint_completed once Ray registered it."""
    number = step_of(metrics, step)
    if checkpoint is not None and number is not None:
        _tag(checkpoint, number)
        _started(number)
    result = _original("report")(metrics, checkpoint, *args, **kwargs)
    _after_report(number, checkpoint is not None)
    return result


@_common.safe("ray: checkpoint started")
def _started(step: int) -> None:
    _rank_known()
    reporter.checkpoint_started(step)


@_common.safe("ray: report")
def _after_report(step: int | None, with_checkpoint: bool) -> None:
    if step is None:
        _common.warn_once(
            "ray: report() without a step",
            "pass step= or put 'step' in the metrics; nothing is reported",
        )
        return
    _rank_known()
    reporter.progress(step)
    if with_checkpoint and reporter.enabled():
        _confirm_later(step)


def get_checkpoint(*args: Any, **kwargs: Any) -> Any:
    """``ray.train.get_checkpoint()``, reporting ``checkpoint_loaded(step)`` when there is one."""
    checkpoint = _original("get_checkpoint")(*args, **kwargs)
    if checkpoint is not None:
        _loaded(checkpoint)
    return checkpoint


@_common.safe("ray: get_checkpoint")
def _loaded(checkpoint: Any) -> None:
    meta = checkpoint.get_metadata() or {}
    step = step_of(None, meta.get(STEP_KEY)) if isinstance(meta, dict) else None
    if step is None:
        _common.warn_once(
            "ray: get_checkpoint()",
            f"the checkpoint at {getattr(checkpoint, 'path', '?')} has no {STEP_KEY} in its "
            "metadata (it was not saved through recoverygate's report); checkpoint_loaded "
            "is not reported",
        )
        return
    _rank_known()
    reporter.checkpoint_loaded(step)


def sigterm_event(timeout: float = 60.0) -> threading.Event:
    """The event a SIGTERM to this Train worker sets, once its handler is installed.

    Call it from the train function. The handler goes on the worker's main thread, where
    Python runs signal handlers: the train function's own thread cannot install one. It
    replaces Ray's handler (which exits the worker at once): the job decides what a
    SIGTERM does, typically a checkpoint and a way out of the train function. If it
    cannot be installed, a warning says why and the event is never set.
    """
    _install_through_actor(timeout)
    return _SIGTERM


@_common.safe("ray: SIGTERM handler")
def _install_through_actor(timeout: float) -> None:
    ray = sys.modules.get("ray") or __import__("ray")
    actor = ray.get_runtime_context().current_actor
    ray.get(actor.execute.remote(_install_sigterm), timeout=timeout)


def _install_sigterm() -> None:
    """Runs on the worker's main thread (an actor task of ``RayTrainWorker``)."""
    import signal

    def on_sigterm(signum: int, frame: Any) -> None:
        _SIGTERM.set()

    signal.signal(signal.SIGTERM, on_sigterm)


def install(module: Any = None) -> None:
    """Patch ``report`` and ``get_checkpoint`` in ``ray.train`` (what RECOVERYGATE_AUTO does)."""
    train = module if module is not None else _train()
    for name, wrapper in (("report", report), ("get_checkpoint", get_checkpoint)):
        current = getattr(train, name, None)
        if current is None or hasattr(current, _MARK):
            continue

        def patched(*args: Any, _wrapper: Any = wrapper, **kwargs: Any) -> Any:
            return _wrapper(*args, **kwargs)

        patched.__name__ = name
        patched.__doc__ = current.__doc__
        setattr(patched, _MARK, current)
        setattr(train, name, patched)
