"""What pyproject.toml cannot say: the repository's top-level ``resources/`` folder (the
demos' weights and pictures) ships inside the wheel as the data package ``core.resources``,
where ``core.demos`` finds it with ``importlib.resources``. Everything else about the
package is in pyproject.toml.
"""

from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent
RESOURCES = ROOT / "resources"
# Every folder under resources/ is a data package of its own, so that setuptools neither
# warns that it looks importable nor leaves it out.
DATA_PACKAGES = ["core.resources"] + [
    "core.resources." + ".".join(folder.relative_to(RESOURCES).parts)
    for folder in sorted(RESOURCES.rglob("*"))
    if folder.is_dir() and folder.name != "__pycache__"
]

setup(
    packages=[*find_packages(include=["core*", "app*"]), *DATA_PACKAGES],
    package_dir={"core.resources": "resources"},
    package_data={name: ["*"] for name in DATA_PACKAGES},
)
