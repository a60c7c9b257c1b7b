"""setuptools build steps for ray_nodeless_up_guard.pth (pyproject.toml [tool.setuptools.cmdclass]): a .pth file runs
only from the root of site-packages, where neither packages nor package data go, so build_py puts it there.

- `pip wheel .` / `make wheel`: into build_lib, whose root is the wheel's root (site-packages when installed).
- `pip install -e .` (PEP 660, setuptools' editable_wheel): build_lib is a scratch directory there, and only the
  unpacked wheel (install_lib) becomes the editable wheel, so the file goes there too.
Not shipped (it is not a module of the project). tests/packaging/test_up_guard_install.py checks both installs.
"""
from __future__ import annotations

from pathlib import Path

from setuptools.command.build_py import build_py

PTH = "ray_nodeless_up_guard.pth"


class BuildPyWithPth(build_py):
    def run(self) -> None:
        super().run()
        src = Path(__file__).with_name(PTH)
        targets = [self.build_lib]
        if getattr(self, "editable_mode", False):
            targets.append(self.get_finalized_command("install").install_lib)
        for target in targets:
            self.mkpath(str(target))
            self.copy_file(str(src), str(Path(target, PTH)), preserve_mode=False)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), str(Path(self.build_lib, PTH))]
