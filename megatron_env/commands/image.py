"""`image`: the profile's environment as an OCI image layout and, with --sqsh, an enroot
squashfs, built from the lock by the tool itself (megatron_env.image)."""

from __future__ import annotations

from pathlib import Path

from megatron_env import output
from megatron_env.commands import places
from megatron_env.commands.cli import command, json_error
from megatron_env.profile import load as load_profile
from megatron_env.units import MIB


@command(out="the OCI image layout directory to write (replaced whole when it is one)",
         sqsh="also write the flattened image as squashfs for enroot/pyxis (FILE.sqsh)",
         base="the base: an OCI layout directory, a docker-archive/oci-archive tarball or a "
              "root file system tarball (default: a minimal Debian made by mmdebstrap)",
         python="the build host's interpreter of the profile's Python (compiles the bytecode)",
         json="print {\"digest\", \"layers\", \"sqsh_sha256\", ...} on stdout")
def image(out: str, profile: str | None = None, sqsh: str | None = None,
          base: str | None = None, python: str | None = None, json: bool = False) -> int:
    """Build a reproducible OCI image (and enroot squashfs) of the profile's lock."""
    from megatron_env.image import build
    from megatron_env.sources import repos

    with json_error(json, "image"):
        prof = load_profile(profile)
        places.announce(cache=repos.cache_dir(), out=Path(out).absolute())
        made = build.build(prof, Path(out), base=base, sqsh=Path(sqsh) if sqsh else None,
                           python=python)
    if json:
        import json as js

        output.block(js.dumps(made.as_json(), indent=1, sort_keys=True) + "\n")
        return 0
    output.table([(x.what, x.digest[:19], f"{x.size / MIB:.1f} MiB",
                   "cached" if x.what in made.reused else "")
                  for x in made.layers], indent="  ")
    output.result(f"kernels: {made.kernels}")
    if made.sqsh:
        output.result(f"sqsh {made.sqsh}: sha256 {made.sqsh_sha256}")
    output.summary(f"image {made.out}: {prof.name}, {made.digest}, {len(made.layers)} layers, "
                   f"{made.size / MIB:.1f} MiB, {made.seconds:.1f} s")
    return 0
