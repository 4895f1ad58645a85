"""The wheel carries the configs and the embedded data (pyproject.toml holds the rest).

``configs/`` and ``data/`` sit at the top of the clone, where people edit them; an
installed package has no clone around it, so building a wheel copies both into the
package as ``t5x_like/_packaged/`` (``t5x_like.resources`` looks there first). The sdist
carries the two folders themselves (MANIFEST.in), so a wheel built from it is the same.
An editable install reads the clone's folders and copies nothing.
"""

import pathlib
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

RESOURCE_FOLDERS = ("configs", "data")
SKIPPED = shutil.ignore_patterns("__pycache__", "*.pyc")


class BuildPyWithResources(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        root = pathlib.Path(__file__).resolve().parent
        for name in RESOURCE_FOLDERS:
            target = pathlib.Path(self.build_lib) / "t5x_like" / "_packaged" / name
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(root / name, target, ignore=SKIPPED)


setup(cmdclass={"build_py": BuildPyWithResources})
