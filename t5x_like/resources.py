"""Where the configs and the embedded data are: in a clone, or inside the installed package.

A clone has them at its top level (``configs/``, ``data/``), where people edit them. A
wheel carries copies of both inside the package (``t5x_like/_packaged/``; ``setup.py``
puts them there when it builds), because an installed package has no checkout around it.
Everything that reads a config by name or a file of the embedded data asks here, so the
same command works from a clone and from ``pip install t5x_like``, from any directory.

The lowest leaf: the standard library only, so the error messages, the config layer and
the data library can all ask it.
"""

from __future__ import annotations

import os
import pathlib

PACKAGE_DIR = pathlib.Path(__file__).resolve().parent
# What the wheel carries (setup.py copies the clone's folders here when it builds).
PACKAGED_DIR = PACKAGE_DIR / "_packaged"
# The clone this module sits in, if it is one (pyproject.toml beside the package).
CHECKOUT_DIR = PACKAGE_DIR.parent


def installed_package() -> bool:
    """True for an installed wheel (it carries its resources), False in a clone."""
    return PACKAGED_DIR.is_dir()


def _in_checkout(name: str) -> pathlib.Path | None:
    folder = CHECKOUT_DIR / name
    return folder if (CHECKOUT_DIR / "pyproject.toml").is_file() and folder.is_dir() else None


def _resource_dir(name: str) -> pathlib.Path | None:
    """The packaged copy when this is an installed wheel, else the clone's folder."""
    packaged = PACKAGED_DIR / name
    return packaged if packaged.is_dir() else _in_checkout(name)


def data_dir() -> pathlib.Path:
    """The embedded corpus, vocabularies and labelled sets: ``T5X_LIKE_DATA_DIR`` when set
    (another copy), else the installed package's copy or the clone's ``data/``."""
    env = os.environ.get("T5X_LIKE_DATA_DIR")
    if env:
        return pathlib.Path(env)
    return _resource_dir("data") or pathlib.Path.cwd() / "data"


def configs_dir() -> pathlib.Path | None:
    """The packaged configs (``quickstart``, ``gpt2_small``, ``pretrain/t5_tiny``, ...), or
    None when neither an installed copy nor a clone holds them."""
    return _resource_dir("configs")


def config_names() -> list[str]:
    """Every packaged config by the name ``--config`` takes: its path under ``configs/``
    without ``.py`` (``quickstart``, ``finetune/t5_embedded_bench``)."""
    folder = configs_dir()
    if folder is None:
        return []
    return sorted(str(p.relative_to(folder).with_suffix("")) for p in folder.rglob("*.py")
                  if not any(part.startswith("_") for part in p.relative_to(folder).parts))


def config_file(name: str) -> pathlib.Path | None:
    """The file of packaged config ``name`` (``quickstart``, ``pretrain/t5_tiny``), or None."""
    folder = configs_dir()
    parts = pathlib.PurePosixPath(name).parts
    # Not a path out of the folder, nor a helper module (_bases): what config_names lists.
    if (folder is None or name.endswith(".py") or name.startswith("/")
            or any(part.startswith(("_", ".")) for part in parts)):
        return None
    file = folder / f"{name}.py"
    return file if file.is_file() else None
