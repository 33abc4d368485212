"""The wheel carries the project files the tool runs from when no checkout is at hand (profiles
under envs/, patches/, scripts/), copied into megatron_env/_project at build time; everything
else is declared in pyproject.toml. Only files a checkout tracks are copied: no caches, no
environments, nothing the building machine made."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PROJECT_FILES = ("envs", "patches", "scripts")
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", ".*", "*.egg-info", "*.part-*")


class BuildWithProject(build_py):
    def run(self) -> None:
        super().run()
        here = Path(__file__).resolve().parent
        dest = Path(self.build_lib) / "megatron_env" / "_project"
        shutil.rmtree(dest, ignore_errors=True)
        for item in PROJECT_FILES:
            if (here / item).is_dir():
                shutil.copytree(here / item, dest / item, ignore=IGNORE)


setup(cmdclass={"build_py": BuildWithProject})
