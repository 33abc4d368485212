"""The OCI image layout (image-spec v1.1: `oci-layout`, `index.json`, `blobs/sha256/`): JSON
documents with sorted keys and no spaces, so the same image is the same bytes, and the layout
read back where a base image comes as one."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from megatron_env import files
from megatron_env.errors import UserError

MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
MEDIA_LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LAYER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"
LAYOUT = {"imageLayoutVersion": "1.0.0"}
MAX_JSON = 16 << 20  # an image's JSON documents are kilobytes; more is not an image


def canonical(doc: Any) -> bytes:
    """The one serialisation: sorted keys, no whitespace, UTF-8."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


@dataclass(frozen=True)
class Layer:
    """A layer blob on disk with what the manifest and config say of it."""

    path: Path
    digest: str
    diff_id: str
    size: int
    media_type: str = MEDIA_LAYER_GZIP
    what: str = ""

    def descriptor(self) -> dict[str, Any]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size}


def blob_path(layout: Path, digest: str) -> Path:
    algo, _, hexd = digest.partition(":")
    if algo != "sha256" or len(hexd) != 64 or any(c not in "0123456789abcdef" for c in hexd):
        raise UserError(f"{layout}: {digest!r} is not a sha256 digest",
                        fix="give a layout written by skopeo, umoci or megatron-env",
                        kind="image.base-not-image")
    return layout / "blobs" / "sha256" / hexd


def put_blob(layout: Path, data: bytes) -> tuple[str, int]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    p = blob_path(layout, digest)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    return digest, len(data)


def put_layer(layout: Path, layer: Layer) -> None:
    """A layer's blob into the layout: a hard link where the file system allows, else a copy."""
    p = blob_path(layout, layer.digest)
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.exists():
        return
    try:
        os.link(layer.path, p)
    except OSError:
        shutil.copyfile(layer.path, p)


def write(layout: Path, layers: list[Layer], config: dict[str, Any],
          annotations: dict[str, str]) -> str:
    """The image into the (empty) directory `layout`; -> the manifest's digest."""
    layout.mkdir(parents=True, exist_ok=True)
    (layout / "oci-layout").write_bytes(canonical(LAYOUT))
    for layer in layers:
        put_layer(layout, layer)
    cdigest, csize = put_blob(layout, canonical(config))
    manifest = {"schemaVersion": 2, "mediaType": MEDIA_MANIFEST,
                "config": {"mediaType": MEDIA_CONFIG, "digest": cdigest, "size": csize},
                "layers": [layer.descriptor() for layer in layers],
                "annotations": annotations}
    mdigest, msize = put_blob(layout, canonical(manifest))
    index = {"schemaVersion": 2, "mediaType": MEDIA_INDEX,
             "manifests": [{"mediaType": MEDIA_MANIFEST, "digest": mdigest, "size": msize,
                            "platform": {"architecture": "amd64", "os": "linux"},
                            "annotations": {"org.opencontainers.image.ref.name": "latest"}}]}
    (layout / "index.json").write_bytes(canonical(index))
    files.sync(layout)
    return mdigest


def read_json(path: Path, what: str) -> Any:
    """A JSON document of an image, capped in size; a bad one is `image.base-not-image`."""
    try:
        if path.stat().st_size > MAX_JSON:
            raise ValueError("too large")
        return json.loads(path.read_bytes())
    except (OSError, ValueError) as e:
        raise UserError(f"{what}: not a readable image document ({e})",
                        fix="give an OCI layout, a docker-archive/oci-archive tarball or a root "
                            "file system tarball", kind="image.base-not-image") from None


def pick_manifest(index: Any, where: str) -> dict[str, Any]:
    """The linux/amd64 image of an index (the only one when it holds one)."""
    entries = index.get("manifests") if isinstance(index, dict) else None
    if not isinstance(entries, list) or not entries:
        raise UserError(f"{where}: index.json lists no image",
                        fix="give an OCI layout written by skopeo copy or umoci",
                        kind="image.base-not-image")
    good = [m for m in entries if isinstance(m, dict)
            and m.get("mediaType") in (MEDIA_MANIFEST, DOCKER_MANIFEST, None)
            and (m.get("platform") or {}).get("architecture", "amd64") == "amd64"]
    if not good:
        raise UserError(f"{where}: no linux/amd64 image in index.json",
                        fix="copy the amd64 image: skopeo copy --override-arch amd64 ...",
                        kind="image.base-not-image")
    return dict(good[0])
