"""The package list, found rather than listed: the repository's models/ (every family folder) installs as
converter.models, mappings/ as converter.mappings (setup.cfg holds the rest)."""

from setuptools import find_packages, setup

setup(
    packages=[
        "converter",
        "converter.mappings",
        "converter.models",
        *(f"converter.models.{package}" for package in find_packages("models")),
    ]
)
