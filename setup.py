"""Build script: maps the top-level folders onto the ``graphfeed.*`` namespace.

``graphfeed`` itself is an implicit namespace package; each top-level folder is one
subpackage (``server/`` -> ``graphfeed.server``).  The native op library in
``cuda_ext/`` is built here as well (see ``cuda_ext/build.py``); when it cannot be
built the package still installs and falls back to the pure-torch sampler.
"""
import importlib.util
import warnings
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).parent
# Every top-level folder with an __init__.py is one graphfeed.* subpackage (core, proto, transport,
# client, server, cli, bench, testing, cuda_ext).
TOP_LEVEL = tuple(sorted(init.parent.name for init in ROOT.glob("*/__init__.py")))


# Folders of data files shipped inside a package (the native ops' C++ sources, compiled on first use).
# setuptools treats every folder under a package as a package, so each one is declared as a
# data-only package with its files as package_data; otherwise build_py warns once per folder.
DATA_FOLDERS = ("cuda_ext/csrc",)


def namespace_packages():
    package_dir, packages, package_data = {}, [], {"graphfeed.proto": ["*.proto"]}
    folders = [init.parent for top in TOP_LEVEL for init in sorted((ROOT / top).rglob("__init__.py"))]
    data = [d for top in DATA_FOLDERS for d in sorted([ROOT / top, *(ROOT / top).rglob("*")]) if d.is_dir()]
    for folder in folders + data:
        rel = folder.relative_to(ROOT)
        name = ".".join(("graphfeed",) + rel.parts)
        packages.append(name)
        package_dir[name] = rel.as_posix()
        if folder in data:
            package_data[name] = ["*"]
    return packages, package_dir, package_data


def native_extension() -> dict:
    """The optional native op library (cuda_ext/build.py decides what to compile)."""
    spec = importlib.util.spec_from_file_location("_graphfeed_native_build", ROOT / "cuda_ext" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.setup_kwargs(ROOT)


# An editable install maps graphfeed.* onto the top-level folders with a meta path finder (the only
# strategy for this layout); setuptools then prints an "Editable installation" notice (InformationOnly)
# cautioning about a ./graphfeed folder shadowing the package, which this layout does not have.
warnings.filterwarnings("ignore", message="Editable installation", category=UserWarning)
packages, package_dir, package_data = namespace_packages()
setup(
    packages=packages,
    package_dir=package_dir,
    package_data=package_data,
    **native_extension(),
)
