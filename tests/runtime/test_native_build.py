"""engine.api.native.build: headers listed with the sources count in the build's identity."""

from __future__ import annotations

import ctypes
import shutil

import pytest

from engine.api import native

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")


def test_a_listed_header_is_hashed_not_compiled(tmp_path, monkeypatch):
    """The library of a source whose header changed is a new build (a cache keyed on the .c
    alone would hand back the old one), and the header is not passed to the compiler."""
    monkeypatch.setenv("ENGINE_CACHE_DIR", str(tmp_path / "cache"))
    src, header = tmp_path / "k.c", tmp_path / "k.h"
    src.write_text('#include "k.h"\nint value(void) { return VALUE; }\n')
    paths = []
    for v in (1, 2):
        header.write_text(f"#define VALUE {v}\n")
        paths.append(native.build("k", [str(src), str(header)]))
        lib = ctypes.CDLL(paths[-1])
        assert lib.value() == v
    assert paths[0] != paths[1]
