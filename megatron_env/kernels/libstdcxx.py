"""libstdc++ and built extensions: each must use the shared runtime torch loads, never carry its
own copy (a toolchain without libstdc++.so links the static archive into every extension)."""

from __future__ import annotations

import os
import subprocess
import tempfile
import zipfile
from pathlib import Path

from megatron_env import files, proc
from megatron_env.errors import UserError


def shared_libstdcxx(build_env: dict[str, str], cache: Path) -> dict[str, str]:
    """LDFLAGS that make the link take the shared libstdc++, where the compiler would copy
    the static one into every extension.

    A g++ whose lib directory holds libstdc++.a but no libstdc++.so (a toolchain copied without
    its development files, as on an H200 node image) answers `-print-file-name=libstdc++.so`
    with the bare name, and its `-lstdc++` then links the archive: the whole libstdc++ lands
    inside the .so, exported (~100 basic_ostream symbols, std::locale::classic), next to the
    runtime torch loaded. A TORCH_CHECK that formats an int then goes through the copy's num_put
    and locale ids and crashes (SIGSEGV in _M_insert<long>, an attention kernel's left-out head
    dim on the H200) or loses the message. The fix:
    a directory with `libstdc++.so` -> the runtime's libstdc++.so.6, first in LDFLAGS (setuptools
    and CMake put LDFLAGS on the link line, and ld searches -L before gcc's own directories)."""
    cxx = build_env.get("CXX") or next(
        (c for c in ("c++", "g++") if proc.which(c, path=build_env.get("PATH"))), None)
    if not cxx:
        return {}
    r = proc.run([cxx, "-print-file-name=libstdc++.so"], timeout=60, env=build_env)
    found = r.stdout.strip()
    if not r.ok or (os.path.isabs(found) and Path(found).exists()):
        return {}
    runtime = _runtime_libstdcxx(cxx, build_env)
    if runtime is None:
        raise UserError(f"{cxx} would link libstdc++ statically into every extension (it has "
                        "no libstdc++.so) and no libstdc++.so.6 was found to link instead",
                        fix="install the compiler's libstdc++ development package "
                            "(libstdc++-<N>-dev), or set CXX to a complete g++",
                        kind="build.no-libstdcxx")
    d = cache / "toolchain" / "libstdcxx"
    d.mkdir(parents=True, exist_ok=True)
    link = d / "libstdc++.so"
    if not link.exists() or link.resolve() != runtime.resolve():
        with files.publishing(link) as tmp:
            tmp.symlink_to(runtime)
    return {"LDFLAGS": " ".join(filter(None, [f"-L{d}", build_env.get("LDFLAGS")]))}


def _runtime_libstdcxx(cxx: str, build_env: dict[str, str]) -> Path | None:
    """The libstdc++.so.6 the system's loader finds (what torch loads), else the compiler's."""
    r = proc.run(["ldconfig", "-p"], timeout=60)
    found = [(name, Path(path)) for name, _, path in
             (line.strip().partition(" => ") for line in (r.stdout.splitlines() if r.ok else []))
             if name.startswith("libstdc++.so.6 ") and Path(path).exists()]
    # `libstdc++.so.6 (libc6,x86-64) => ...`: the 64-bit one before a 32-bit multilib copy
    found.sort(key=lambda f: "64" not in f[0])
    if found:
        return found[0][1]
    r = proc.run([cxx, "-print-file-name=libstdc++.so.6"], timeout=60, env=build_env)
    p = Path(r.stdout.strip())
    return p if r.ok and p.is_absolute() and p.exists() else None


# std::locale::classic(): defined only by a libstdc++ itself (static copy or the runtime)
_OWN_RUNTIME = "_ZNSt6locale7classicEv"


def own_copies(wheel: Path) -> dict[str, int]:
    """{shared object in the wheel: exported libstdc++ stream symbols} for each .so that
    carries its own libstdc++ (defines std::locale::classic or exports basic_ostream
    instances); empty when every one links the shared runtime. Read with `nm -D`."""
    bad = {}
    with zipfile.ZipFile(wheel) as z, tempfile.TemporaryDirectory(prefix="abi-") as tmp:
        for name in (n for n in z.namelist() if n.endswith(".so") or ".so." in n):
            so = Path(z.extract(name, tmp))
            r = subprocess.run(["nm", "-D", "-C", "--defined-only", str(so)],
                               capture_output=True, text=True)
            if r.returncode != 0:
                continue  # nm missing or not an ELF: nothing to judge
            streams = sum("basic_ostream" in line for line in r.stdout.splitlines())
            raw = subprocess.run(["nm", "-D", "--defined-only", str(so)],
                                 capture_output=True, text=True).stdout
            if streams or _OWN_RUNTIME in raw:
                bad[name] = streams
    return bad
