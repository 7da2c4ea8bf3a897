"""Docstring examples of the modality folders, imported through the package namespace (mmspec.vision ...).

The core's examples run through pytest's --doctest-modules (pyproject.toml); the modality folders are
mapped into ``mmspec`` by package-dir, so collecting them as files would import them a second time under
their folder names.
"""

import doctest
import importlib
import pkgutil

import pytest

import mmspec


def _modules():
    names = []
    for pkg in ("mmspec.vision", "mmspec.drivers", "mmspec.image_ar", "mmspec.kernels"):
        mod = importlib.import_module(pkg)
        names.append(pkg)
        names += [m.name for m in pkgutil.walk_packages(mod.__path__, prefix=f"{pkg}.")]
    return names


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
