#!/usr/bin/env python3
"""A stand-in for micromamba, built on py-rattler, for the tests only.

It answers the three calls conda-lock makes of a conda solver: `--version`, the dry-run solve
(`create --prefix P --dry-run --json --override-channels --channel URL... SPECS`, printing the
FETCH/LINK plan as JSON) and the install of an explicit lock (`create --prefix P --file F --yes`).
Solving and installing are rattler's, against whatever channels are given (the tests build a
local file:// channel), so no network is needed.
"""

import asyncio
import hashlib
import json
import os
import sys
import tarfile
import tempfile
from pathlib import Path
from urllib.parse import urlparse

import rattler


def parse(argv):
    opts = {"channels": [], "specs": [], "prefix": None, "file": None, "dry_run": False}
    it = iter(argv)
    for a in it:
        if a in ("--prefix", "-p"):
            opts["prefix"] = next(it)
        elif a in ("--channel", "-c"):
            opts["channels"].append(next(it))
        elif a == "--file":
            opts["file"] = next(it)
        elif a == "--dry-run":
            opts["dry_run"] = True
        elif a.startswith("-"):
            continue  # --json, --yes, --quiet, --override-channels, --copy
        else:
            opts["specs"].append(a)
    return opts


def platforms():
    return [os.environ.get("CONDA_SUBDIR", "linux-64"), "noarch"]


def fetch_action(r):
    return {"name": r.name.normalized, "version": str(r.version), "build": str(r.build),
            "build_number": r.build_number, "url": r.url, "fn": r.file_name,
            "md5": r.md5.hex() if r.md5 else "", "sha256": r.sha256.hex() if r.sha256 else None,
            "depends": list(r.depends), "subdir": r.subdir, "channel": str(r.channel or "")}


def solve(opts):
    specs = [s.split("::")[-1] for s in opts["specs"]]
    try:
        records = asyncio.run(rattler.solve(opts["channels"], specs, platforms=platforms()))
    except Exception as e:  # noqa: BLE001 - the message is what conda-lock shows
        print(json.dumps({"success": False, "message": str(e)}))
        return 1
    actions = [fetch_action(r) for r in records]
    print(json.dumps({"success": True, "dry_run": True,
                      "actions": {"FETCH": actions, "LINK": actions, "PREFIX": opts["prefix"]}}))
    return 0


def record_of_archive(url):
    """A RepoDataRecord read from the package file itself (its info/index.json), as micromamba
    installs an explicit file:// URL with no repodata beside it (an offline bundle's copies)."""
    path = Path(urlparse(url).path)
    data = path.read_bytes()
    with tarfile.open(path) as tar, tempfile.TemporaryDirectory() as tmp:
        index = Path(tmp) / "index.json"
        index.write_bytes(tar.extractfile("info/index.json").read())
        record = rattler.PackageRecord.from_index_json(
            index, size=len(data), sha256=hashlib.sha256(data).hexdigest(),
            md5=hashlib.md5(data).hexdigest())
    return rattler.RepoDataRecord(record, path.name, url, f"file://{path.parent.parent}")


def records_for_urls(urls):
    """RepoDataRecords for explicit package URLs of file:// channels, or of bare files."""
    wanted = {u.split("#")[0] for u in urls}
    roots = {str(Path(urlparse(u).path).parent.parent) for u in wanted}
    out = []
    for root in roots:
        channel = rattler.Channel(f"file://{root}")
        for subdir in Path(root).iterdir():
            repodata = subdir / "repodata.json"
            if repodata.is_file():
                records = rattler.RepoData.from_path(repodata).into_repo_data(channel)
                out += [r for r in records if r.url.split("#")[0] in wanted]
    found = {r.url.split("#")[0] for r in out}
    return out + [record_of_archive(u) for u in sorted(wanted - found)
                  if Path(urlparse(u).path).is_file()]


def install(opts):
    lines = Path(opts["file"]).read_text().splitlines()
    urls = [line.strip() for line in lines if line.strip().startswith("file://")]
    records = records_for_urls(urls)
    if len(records) != len(urls):
        print(f"stub micromamba: {len(urls)} packages in the lock, {len(records)} found",
              file=sys.stderr)
        return 1
    # A package cache of its own: the user's (~/.cache/rattler) is keyed by name-version-build,
    # and the tests build packages of one name and version with different contents.
    with tempfile.TemporaryDirectory(prefix="rattler-cache-") as cache:
        asyncio.run(rattler.install(records, Path(opts["prefix"]).resolve(), cache_dir=cache,
                                    show_progress=False))
    return 0


def main(argv):
    if argv[:1] == ["--version"]:
        print("1.5.10")
        return 0
    if argv[:1] == ["create"]:
        opts = parse(argv[1:])
        return solve(opts) if opts["dry_run"] else install(opts)
    print(f"stub micromamba: unsupported call {argv}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    # py-rattler's runtime threads can outlive the interpreter's finalisation and abort it
    # ("Fatal Python error: PyGILState_Release ... finalizing": one CI run in a few), turning a
    # finished solve into a failed one: flush what was printed and leave without finalising
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)
