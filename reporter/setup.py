"""Install ``recoverygate-auto.pth`` next to the package, for wheels and editable installs alike.

Everything else is in pyproject.toml. A ``.pth`` file must sit directly in site-packages,
which no pyproject key of setuptools can express: ``build_py`` copies it to the root of
the build (a normal wheel), and ``editable_wheel`` puts it at the root of the editable
wheel (``pip install -e``, which otherwise installs only a path finder). The hook it
holds is described in recoverygate/integrations/auto.py.
"""

from __future__ import annotations

import os

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

PTH = "recoverygate-auto.pth"
HERE = os.path.dirname(os.path.abspath(__file__))


class BuildPyWithPth(build_py):
    def run(self) -> None:
        super().run()
        self.copy_file(os.path.join(HERE, PTH), os.path.join(self.build_lib, PTH), preserve_mode=0)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:  # type: ignore[override]
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, PTH)]


class EditableWheelWithPth(editable_wheel):
    # The one step that receives the folder unpacked into the editable wheel (setuptools
    # >= 64); everything put there is installed into site-packages.
    def _install_namespaces(self, installation_dir: str, pth_prefix: str) -> None:
        super()._install_namespaces(installation_dir, pth_prefix)
        self.copy_file(
            os.path.join(HERE, PTH), os.path.join(installation_dir, PTH), preserve_mode=0
        )


setup(cmdclass={"build_py": BuildPyWithPth, "editable_wheel": EditableWheelWithPth})
