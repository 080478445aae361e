"""Zero lines: with ``RECOVERYGATE_AUTO=1`` every HF and Lightning ``Trainer`` gets the callback,
and Ray Train's ``report`` / ``get_checkpoint`` report the checkpoint events.

The reporter distribution installs ``recoverygate-auto.pth`` into site-packages. Python
runs its one line at start-up; with ``RECOVERYGATE_AUTO`` unset (or empty, or ``0``) that
line is one environment lookup and nothing else (bench/bench_auto.py measures it).
Otherwise it calls :func:`install`, which puts one finder at the front of
``sys.meta_path``. The finder does nothing until one of these modules is imported, and
then patches exactly one thing in it, once the module has run:

============================================  ===============================================
module                                        patched
============================================  ===============================================
``transformers.trainer``                      ``Trainer.__init__``: after it returns,
                                              ``self.add_callback(RecoveryGateCallback())``
``lightning.pytorch.trainer.trainer``         ``Trainer.__init__``: after it returns,
                                              ``self.callbacks.append(RecoveryGateCallback())``
``pytorch_lightning.trainer.trainer``         the same, with the ``pytorch_lightning`` callback
``ray.train``                                 ``report`` and ``get_checkpoint``: the wrappers
                                              of :mod:`recoverygate.integrations.ray`
``torchft.manager``                           ``Manager.__init__``: after it returns,
                                              ``integrations.torchft.instrument(self)``
============================================  ===============================================

A trainer that already has a ``RecoveryGateCallback`` (added by hand) gets no second one;
a manager instrumented by hand is not instrumented twice.
Nothing else is changed: the resume logic, the checkpoint folder and the process group
are the job's own -- a drill is there to see them as they are.

``RECOVERYGATE_AUTO`` takes ``1`` (every framework), a comma list of ``transformers``,
``lightning`` (it covers both Lightning packages), ``ray`` and ``torchft``, or
``0``/empty/unset (off). It may also be a JSON object, ``{"evidence": {...},
"frameworks": "1"}``: ``evidence`` turns the job's own log lines into events
(:mod:`recoverygate.evidence`, docs/evidence.md), ``frameworks`` is the list above
(default none). A drill with an ``evidence:`` section sets it for the jobs it launches;
``recoverygate validate`` prints it for a job the drill attaches to.
To turn it off, unset it; :func:`uninstall` removes the finder and the patches in a
running process.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing is not imported: this module loads at interpreter start-up
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

__all__ = ["ENV", "install", "installed", "patched", "uninstall", "wanted"]

ENV = "RECOVERYGATE_AUTO"
_OFF = {"", "0", "false", "no", "off"}
_ON = {"1", "true", "yes", "on", "all"}
_FRAMEWORKS = ("transformers", "lightning", "ray", "torchft")
_MARK = "__recoverygate_original__"

#: module name -> (framework, what to patch in it)
_TARGETS: dict[str, tuple[str, str]] = {
    "transformers.trainer": ("transformers", "transformers"),
    "lightning.pytorch.trainer.trainer": ("lightning", "lightning.pytorch"),
    "pytorch_lightning.trainer.trainer": ("lightning", "pytorch_lightning"),
    "ray.train": ("ray", "ray.train"),
    "torchft.manager": ("torchft", "torchft"),
}
#: module name -> the class whose ``__init__`` is patched (default ``Trainer``)
_CLASSES = {"torchft.manager": "Manager"}
#: Watched when the output is tapped (an evidence spec): Ray's worker process replaces
#: ``sys.stdout``/``sys.stderr`` through this module's ``open_log``, and the tap must stay.
_RAY_STREAMS = "ray._private.utils"


def wanted(value: str | None = None) -> frozenset[str]:
    """The frameworks ``RECOVERYGATE_AUTO`` (or ``value``) asks for; empty when off."""
    text = (os.environ.get(ENV, "") if value is None else value).strip().lower()
    if text.startswith("{"):
        text = _json_frameworks(text)
    if text in _OFF:
        return frozenset()
    if text in _ON:
        return frozenset(_FRAMEWORKS)
    names = {part.strip() for part in text.split(",") if part.strip()}
    return frozenset(name for name in names if name in _FRAMEWORKS)


def _json_frameworks(text: str) -> str:
    """The ``frameworks`` of a JSON ``RECOVERYGATE_AUTO`` value ("" when it has none)."""
    import json

    try:
        data = json.loads(text)
    except ValueError:
        return ""
    frameworks = data.get("frameworks") if isinstance(data, dict) else None
    return frameworks.strip().lower() if isinstance(frameworks, str) else ""


def _install_evidence(value: str | None) -> bool:
    """Tap this process's output when ``RECOVERYGATE_AUTO`` holds an evidence spec."""
    text = (os.environ.get(ENV, "") if value is None else value).strip()
    if not text.startswith("{"):
        return False
    from recoverygate import evidence

    spec = evidence.spec_from_json(text)
    if spec is None:
        _warn(f"{ENV} holds no valid evidence spec; nothing is matched")
        return False
    return evidence.install(spec)


def _warn(error: BaseException | str) -> None:
    from recoverygate.integrations._common import warn_once

    warn_once(f"{ENV}: the callback was not added", error)


def _add_transformers(trainer: Any) -> None:
    from recoverygate.integrations.transformers import callback_class

    cls = callback_class()
    if not any(isinstance(cb, cls) for cb in trainer.callback_handler.callbacks):
        trainer.add_callback(cls())


def _add_lightning(namespace: str, trainer: Any) -> None:
    from recoverygate.integrations.lightning import callback_class

    cls = callback_class(namespace)
    if not any(isinstance(cb, cls) for cb in trainer.callbacks):
        trainer.callbacks.append(cls())


def _instrument_torchft(manager: Any) -> None:
    from recoverygate.integrations.torchft import instrument

    instrument(manager)


def _patch(module: Any, add: Callable[[Any], None], name: str = "Trainer") -> None:
    """Wrap ``module.<name>.__init__`` so that ``add(instance)`` runs after it returns."""
    import functools

    cls = getattr(module, name)
    original = cls.__dict__["__init__"]
    if hasattr(original, _MARK):
        return

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        try:
            add(self)  # a subclass calling super().__init__ gets here once: add checks
        except Exception as error:  # never raise into the job's own code
            _warn(error)

    setattr(__init__, _MARK, original)
    cls.__init__ = __init__


def _patch_module(name: str, module: Any) -> None:
    if name == _RAY_STREAMS:
        from recoverygate import evidence

        evidence.tap_ray_streams(module)
        return
    framework, namespace = _TARGETS[name]
    if framework == "ray":
        from recoverygate.integrations.ray import install as install_ray

        install_ray(module)
    elif framework == "transformers":
        _patch(module, _add_transformers)
    elif framework == "torchft":
        _patch(module, _instrument_torchft, _CLASSES[name])
    else:
        _patch(module, lambda trainer: _add_lightning(namespace, trainer))


class _PatchingLoader:
    """The real loader, plus the patch once the module has run."""

    def __init__(self, loader: Any, name: str) -> None:
        self._loader = loader
        self._name = name

    def __getattr__(self, attr: str) -> Any:  # get_source, is_package, ...: the real loader's
        return getattr(self._loader, attr)

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)  # the framework's own errors propagate as usual
        try:
            _patch_module(self._name, module)
        except Exception as error:
            _warn(error)


class _Finder:
    """A meta-path finder that only ever answers for the trainer modules of :data:`_TARGETS`."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in self.names:
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _PatchingLoader(spec.loader, name)
        return spec


def installed() -> bool:
    """Whether the finder is on ``sys.meta_path``."""
    return any(isinstance(finder, _Finder) for finder in sys.meta_path)


def install(value: str | None = None) -> bool:
    """Add the finder for the frameworks ``RECOVERYGATE_AUTO`` (or ``value``) names.

    Modules already imported are patched at once. Returns whether anything is watched.
    Called by ``recoverygate-auto.pth``; never raises.
    """
    try:
        tapped = _install_evidence(value)
        frameworks = wanted(value)
        names = frozenset(name for name, (fw, _) in _TARGETS.items() if fw in frameworks)
        watched = names | ({_RAY_STREAMS} if tapped else set())
        if not watched or installed():
            return bool(names) or tapped
        sys.meta_path.insert(0, _Finder(frozenset(watched)))
        for name in watched:
            module = sys.modules.get(name)
            if module is not None and (
                name in ("ray.train", _RAY_STREAMS)
                or hasattr(module, _CLASSES.get(name, "Trainer"))
            ):
                _patch_module(name, module)
        return True
    except Exception as error:
        _warn(error)
        return False


def patched() -> list[str]:
    """The modules whose ``Trainer.__init__`` (``Manager.__init__``) is patched here."""
    found = []
    for name in _TARGETS:
        module = sys.modules.get(name)
        if name == "ray.train":
            if hasattr(getattr(module, "report", None), _MARK):
                found.append(name)
            continue
        cls = getattr(module, _CLASSES.get(name, "Trainer"), None)
        init = getattr(cls, "__dict__", {}).get("__init__")
        if init is not None and hasattr(init, _MARK):
            found.append(name)
    return found


def uninstall() -> None:
    """Remove the finder and restore every patched ``Trainer.__init__``."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Finder)]
    for name in patched():
        if name == "ray.train":
            module = sys.modules[name]
            for attr in ("report", "get_checkpoint"):
                fn = getattr(module, attr)
                setattr(module, attr, getattr(fn, _MARK, fn))
            continue
        cls = getattr(sys.modules[name], _CLASSES.get(name, "Trainer"))
        cls.__init__ = getattr(cls.__dict__["__init__"], _MARK)
