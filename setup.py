"""What pyproject.toml cannot say: how the repository's folders become the one import
package ``gradexplorer`` (docs/ARCHITECTURE.md, "One package from three folders").

- ``core/`` is the package itself: ``gradexplorer`` and its subpackages (the engine and the
  public API in ``core/__init__.py``);
- ``app/`` is ``gradexplorer.app`` (the window and the command line);
- ``resources/`` is the data package ``gradexplorer.resources`` (the demos' weights and
  pictures, found with ``importlib.resources``).

setuptools' ``package_dir`` maps the three; editable installs honour it through their
import finder. Everything else about the package is in pyproject.toml.
"""

from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent
FOLDERS = {"gradexplorer": "core", "gradexplorer.app": "app", "gradexplorer.resources": "resources"}


def _packages(package: str, folder: str, *, data: bool = False) -> list[str]:
    """The package of ``folder`` and of every folder below it that is one (every folder, for
    the data package: setuptools would otherwise warn that it looks importable, or leave it out)."""
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
    # py.typed: the package's annotations are its types for a user's mypy or pyright (PEP 561).
    package_data={"gradexplorer": ["py.typed"],
                  **{name: ["*"] for name in PACKAGES if name.startswith("gradexplorer.resources")}},
)
