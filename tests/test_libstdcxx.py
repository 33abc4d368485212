"""Extensions link the shared libstdc++, never a static copy (megatron_env/kernels/libstdcxx.py).

On an H200 node image g++ had libstdc++.a but no libstdc++.so, so every extension carried its
own exported libstdc++ and flash-attn died with SIGSEGV formatting an int in a TORCH_CHECK. Here
a compiler without libstdc++.so is a real g++ behind a wrapper that answers
`-print-file-name=libstdc++.so` as that toolchain did; the links and the symbol checks are real
(g++, ld, nm)."""

import subprocess
import zipfile
from pathlib import Path

import pytest

from megatron_env.kernels import libstdcxx
from megatron_env.proc import which

pytestmark = pytest.mark.skipif(not which("g++") or not which("nm"), reason="needs g++ and nm")

SRC = ('#include <sstream>\n#include <string>\n'
       'std::string fmt(int v) { std::ostringstream s; s << "head dim " << v; return s.str(); }\n')


def so(tmp: Path, name: str, *flags: str) -> Path:
    (tmp / "f.cpp").write_text(SRC)
    out = tmp / f"{name}.so"
    subprocess.run(["g++", "-shared", "-fPIC", "-O2", tmp / "f.cpp", "-o", out, *flags],
                   check=True)
    return out


def wheel(tmp: Path, lib: Path) -> Path:
    w = tmp / f"{lib.stem}-1.0-cp312-cp312-linux_x86_64.whl"
    with zipfile.ZipFile(w, "w") as z:
        z.write(lib, f"pkg/{lib.name}")
        z.writestr("pkg-1.0.dist-info/RECORD", "")
    return w


def needed(lib: Path) -> str:
    return subprocess.run(["readelf", "-d", lib], capture_output=True, text=True).stdout


def test_a_complete_compiler_is_left_alone(tmp_path):
    env = {"PATH": "/usr/bin:/bin"}
    assert libstdcxx.shared_libstdcxx(env, tmp_path) == {}


def test_a_compiler_without_libstdcxx_so_gets_the_runtime_first_in_ldflags(tmp_path):
    fake = tmp_path / "bin" / "g++"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\n[ "$1" = "-print-file-name=libstdc++.so" ] && '
                    '{ echo libstdc++.so; exit 0; }\nexec /usr/bin/g++ "$@"\n')
    fake.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "CXX": str(fake), "LDFLAGS": "-Wl,-O1"}
    flags = libstdcxx.shared_libstdcxx(env, tmp_path / "cache")
    ldflags = flags["LDFLAGS"].split()
    assert ldflags[0].startswith("-L") and ldflags[1:] == ["-Wl,-O1"]  # first, the caller's kept
    link = Path(ldflags[0][2:]) / "libstdc++.so"
    assert link.resolve().name.startswith("libstdc++.so.6") and link.resolve().exists()
    # and a link with those flags takes the runtime: NEEDED libstdc++.so.6, no copy inside
    lib = so(tmp_path, "fixed", *ldflags)
    assert "libstdc++.so.6" in needed(lib)
    assert libstdcxx.own_copies(wheel(tmp_path, lib)) == {}
    assert libstdcxx.shared_libstdcxx(env, tmp_path / "cache") == flags  # idempotent


def test_a_wheel_whose_extension_carries_libstdcxx_is_named(tmp_path):
    good = wheel(tmp_path, so(tmp_path, "shared"))
    assert libstdcxx.own_copies(good) == {}
    bad = wheel(tmp_path, so(tmp_path, "static", "-static-libstdc++"))
    found = libstdcxx.own_copies(bad)
    assert list(found) == ["pkg/static.so"] and found["pkg/static.so"] > 10, found
