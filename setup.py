"""What pyproject.toml cannot say: which folders hold the distribution's packages
(docs/ARCHITECTURE.md, "Source roots").

- ``core/gradexplorer`` is the engine and the public API (``import gradexplorer as gx``);
- ``app/gradexplorer_app`` is the window and the command line;
- ``resources/`` holds data only (the demos' weights and pictures): a wheel ships it inside
  the engine's package as ``gradexplorer/resources``; a checkout reads the folder itself
  (``gradexplorer.models.demos``).

Each module's path is its import name below its source root (``core/`` or ``app/``), so
mypy, import-linter and an IDE read the repository as it is. Everything else about the
distribution is in pyproject.toml.
"""

from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent
FOLDERS = {"gradexplorer": "core/gradexplorer", "gradexplorer_app": "app/gradexplorer_app",
           "gradexplorer.resources": "resources"}


def _packages(package: str, folder: str, *, data: bool = False) -> list[str]:
    """The package of ``folder`` and of every folder below it that is one (every folder, for
    the data: setuptools would otherwise warn that it looks importable, or leave it out)."""
    base = ROOT / folder
    found = [package]
    for sub in sorted(base.rglob("*")):
        if not sub.is_dir() or sub.name == "__pycache__":
            continue
        if data or (sub / "__init__.py").is_file():
            found.append(".".join([package, *sub.relative_to(base).parts]))
    return found


PACKAGES = [name for package, folder in FOLDERS.items()
            for name in _packages(package, folder, data=package == "gradexplorer.resources")]
setup(
    packages=PACKAGES,
    package_dir=FOLDERS,
    # py.typed: the annotations are the packages' types for a user's mypy or pyright (PEP 561).
    package_data={"gradexplorer": ["py.typed"], "gradexplorer_app": ["py.typed"],
                  **{name: ["*"] for name in PACKAGES if name.startswith("gradexplorer.resources")}},
)
