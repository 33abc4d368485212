"""Where a build finds its compilers and headers: the CUDA toolkit that matches torch, and the
recipe's directories inside the target environment (torch's own nvidia-* wheels)."""

from __future__ import annotations

import os
from pathlib import Path

from megatron_env import proc
from megatron_env.errors import UserError
from megatron_env.host import parsers
from megatron_env.recipes.recipe import Package


def cuda_home(torch_cuda: str | None) -> tuple[Path | None, str | None]:
    """A toolkit whose nvcc has torch's CUDA major version (refuse a major mismatch).

    A home needs bin/nvcc and include/cuda_runtime.h: an nvcc on PATH may be a wrapper script
    in /usr/local/bin, whose parent is no toolkit, and building against it fails only at the
    first #include, minutes in."""
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    if nvcc := proc.which("nvcc"):
        candidates.append(str(Path(nvcc).resolve().parent.parent))
    candidates += ["/usr/local/cuda", *sorted(map(str, Path("/usr/local").glob("cuda-*")),
                                              reverse=True)]
    seen = []
    for home in dict.fromkeys(filter(None, candidates)):
        nvcc_path = Path(home) / "bin" / "nvcc"
        if not nvcc_path.exists():
            continue
        if not (Path(home) / "include" / "cuda_runtime.h").exists():
            seen.append(f"{home} (no include/cuda_runtime.h)")
            continue
        r = proc.run([nvcc_path, "--version"], timeout=60)
        try:
            release = parsers.nvcc_release(r.output)
        except parsers.ParseError:
            seen.append(f"{home} (nvcc --version unreadable)")
            continue
        seen.append(f"{home} (nvcc {release})")
        if torch_cuda and release.split(".")[0] == torch_cuda.split(".")[0]:
            return Path(home), release
    if not torch_cuda:
        raise UserError("torch in the environment is a CPU build: nothing to build CUDA kernels "
                        "for", fix="build the environment of a CUDA profile",
                        kind="toolkit.cpu-torch")
    raise UserError(
        f"no CUDA {torch_cuda.split('.')[0]}.x toolkit for torch's CUDA {torch_cuda}; found: "
        + (", ".join(seen) or "no nvcc at all"),
        fix=f"install the CUDA {torch_cuda} toolkit (the profile's conda environment has it) "
            "and set CUDA_HOME", kind="toolkit.missing")


def site_paths(pkg: Package, platlib: str | None) -> dict[str, str]:
    """The recipe's site_paths made absolute in the target environment, in front of the
    caller's value: a build that wants torch's own cuDNN/NCCL headers (nvidia-* wheels), not
    whatever a node has on its default include path."""
    out = {}
    for var, rel in pkg.site_paths.items():
        dirs = [Path(platlib or "") / r for r in rel]
        if absent := [str(d) for d in dirs if not platlib or not d.is_dir()]:
            raise UserError(f"{pkg.name} builds against {', '.join(rel)} of the environment's "
                            f"site-packages; not there: {', '.join(absent)}",
                            fix="install torch with its CUDA wheels (nvidia-*) in the environment "
                                "(`invoke env`), or build in the environment that has them",
                            kind="build.site-paths")
        out[var] = os.pathsep.join([*map(str, dirs), *filter(None, [os.environ.get(var)])])
    return out

