"""A kernel stand-in for the setup chain's tests on a machine without a GPU: `tinykern`, a
recipe (written into a test checkout's megatron_env/recipes/, where the registry finds it like
any other) whose sdist holds one real compiled extension, `tinykern._C`, built from C by an
in-tree PEP 517 backend with the system's C compiler (no setuptools, no torch headers, no
CUDA: `cuda = False`, so the builds step runs here). The wheel records the torch it was built
with (`tinykern._built_for.TORCH`), as a real kernel's compiled code is bound to one. It goes through the same machinery as
flash-attn: fetch by sha256 (MEGATRON_ENV_SOURCE_TINYKERN), patches, `uv build
--no-build-isolation` into the content-addressed wheel cache, install, import check.
"""

from __future__ import annotations

import hashlib
import tarfile
import textwrap
from pathlib import Path

NAME = "tinykern"
VERSION = "1.0"
MODULE = "tinykern._C"
SOURCE_VAR = "MEGATRON_ENV_SOURCE_TINYKERN"

RECIPE = textwrap.dedent('''\
    """The tests' kernel stand-in: one C extension, no CUDA."""

    from megatron_env.recipes.recipe import Recipe

    RECIPE = Recipe(name="tinykern", about="the tests' kernel stand-in (one C extension)",
                    source="sdist", sdist="tinykern-{version}.tar.gz", modules=("tinykern._C",),
                    cuda=False, gib_per_job=0.25)
    ''')

C_SOURCE = textwrap.dedent("""\
    #include <Python.h>
    static PyObject *answer(PyObject *self, PyObject *args) { return PyLong_FromLong(42); }
    static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, "42"}, {0}};
    static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "_C", 0, -1, methods};
    PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&mod); }
    """)

# PEP 517 hooks in the tree: compile csrc/k.c with $CC (the pool's wrapper when it builds from
# the shared pool) into tinykern/_C<EXT_SUFFIX>, and pack a platform wheel with its RECORD
BACKEND = textwrap.dedent('''\
    import base64, csv, hashlib, io, os, shlex, subprocess, sys, sysconfig, zipfile
    NAME, VERSION = "tinykern", "1.0"
    DIST = f"{NAME}-{VERSION}.dist-info"

    def _tag():
        py = f"cp{sys.version_info[0]}{sys.version_info[1]}"
        return f"{py}-{py}-" + sysconfig.get_platform().replace("-", "_").replace(".", "_")

    def get_requires_for_build_wheel(config_settings=None):
        return []

    def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
        os.makedirs("build", exist_ok=True)
        so = os.path.join("build", "_C.so")
        cc = shlex.split(os.environ.get("CC") or "cc")
        subprocess.run([*cc, "-shared", "-fPIC", "-O0", "-I", sysconfig.get_paths()["include"],
                        "csrc/k.c", "-o", so], check=True)
        files = {f"tinykern/{n}": open(f"tinykern/{n}", "rb").read()
                 for n in sorted(os.listdir("tinykern")) if os.path.isfile(f"tinykern/{n}")}
        files["tinykern/_C" + sysconfig.get_config_var("EXT_SUFFIX")] = open(so, "rb").read()
        try:  # the torch it was built against, as a real kernel's compiled code holds it
            from importlib.metadata import version
            built_for = version("torch")
        except Exception:
            built_for = ""
        files["tinykern/_built_for.py"] = ("TORCH = %r\\n" % built_for).encode()
        files[f"{DIST}/METADATA"] = f"Metadata-Version: 2.1\\nName: {NAME}\\nVersion: {VERSION}\\n".encode()
        files[f"{DIST}/WHEEL"] = (f"Wheel-Version: 1.0\\nGenerator: test\\n"
                                  f"Root-Is-Purelib: false\\nTag: {_tag()}\\n").encode()
        rec = io.StringIO()
        w = csv.writer(rec, lineterminator="\\n")
        for p, blob in files.items():
            h = base64.urlsafe_b64encode(hashlib.sha256(blob).digest()).rstrip(b"=")
            w.writerow([p, "sha256=" + h.decode(), len(blob)])
        w.writerow([f"{DIST}/RECORD", "", ""])
        files[f"{DIST}/RECORD"] = rec.getvalue().encode()
        name = f"{NAME}-{VERSION}-{_tag()}.whl"
        with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as z:
            for p, blob in files.items():
                z.writestr(p, blob)
        return name
    ''')

PYPROJECT = ('[build-system]\nrequires = []\nbuild-backend = "backend"\n'
             'backend-path = ["_build"]\n\n[project]\nname = "tinykern"\nversion = "1.0"\n')


def make_sdist(root: Path, modules: int = 0) -> tuple[Path, str]:
    """(root/tinykern-1.0.tar.gz, its sha256). `modules`: that many more pure-Python modules
    in the package (tinykern/m0000.py ...), so that installing its wheel takes long enough to
    be interrupted in the middle."""
    src = root / f"{NAME}-{VERSION}"
    more = {f"tinykern/m{i:04d}.py": f"X = {i}\n" * 20 for i in range(modules)}
    for rel, text in {"csrc/k.c": C_SOURCE, "tinykern/__init__.py": "", **more,
                      "_build/backend.py": BACKEND, "pyproject.toml": PYPROJECT}.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    sdist = root / f"{NAME}-{VERSION}.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        tar.add(src, arcname=src.name)
    return sdist, hashlib.sha256(sdist.read_bytes()).hexdigest()


def add_to(work: Path, profile: Path, sha256: str) -> None:
    """The recipe into the checkout `work`, and its pin into `profile` (a profile.toml)."""
    (work / "megatron_env" / "recipes" / f"{NAME}.py").write_text(RECIPE)
    profile.write_text(profile.read_text()
                       + f'\n[kernels.{NAME}]\nversion = "{VERSION}"\nsha256 = "{sha256}"\n')
