"""What pyproject.toml cannot say: the version, read from the one place it is written
(``reporter/recoverygate/__init__.py``), and the dependencies, which pin the reporter
distribution to that same version (``pytest_recoverygate`` reads its ``wire`` module).
Everything else is in pyproject.toml.
"""

import re
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
_SOURCE = (HERE / "reporter" / "recoverygate" / "__init__.py").read_text(encoding="utf-8")
VERSION = re.search(r'^__version__ = "([^"]+)"$', _SOURCE, re.M).group(1)  # type: ignore[union-attr]


class BuildWithDocs(build_py):
    """Ship docs/*.md inside the package (``pytest_recoverygate/docs/``): the links that
    messages print (``pytest_recoverygate.links``) resolve to these files once installed."""

    def run(self) -> None:
        super().run()
        pages = sorted((HERE / "docs").glob("*.md"))
        if not pages:
            raise SystemExit("setup.py: docs/*.md is missing; the package's links need it")
        target = Path(self.build_lib, "pytest_recoverygate", "docs")
        target.mkdir(parents=True, exist_ok=True)
        for page in pages:
            shutil.copyfile(page, target / page.name)


setup(
    cmdclass={"build_py": BuildWithDocs},
    version=VERSION,
    install_requires=[
        f"recoverygate-reporter=={VERSION}",
        "pydantic>=2.11,<3",
        "pyyaml>=6",
        "psutil>=5.9",
        "pytest>=7.4",
        # kubectl recoverygate is a headline entry point: the client comes with the package
        # (imported lazily, only by the kubernetes backend, so --help stays fast).
        "kubernetes>=35",
        # StorageFault's storage layer (a FUSE passthrough over the checkpoint folder, its
        # own process; needs libfuse3 from the system: Debian's fuse3).
        "mfusepy>=3.1",
    ],
)
