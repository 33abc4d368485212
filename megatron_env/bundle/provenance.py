"""Who made a bundle, checked before anything of it is unpacked. Three levels (docs/bundle.md):

- none: the manifest's hashes catch a corrupted file, not an edited one (an editor re-hashes
  manifest.json to match);
- sha256: the archive's sha256, learned out of band (`B.tar.sha256`, printed by `invoke bundle`),
  is compared (`--expect-sha256`): the archive is byte for byte the one that was published;
- signature: an OpenSSH signature (`B.tar.sig`, `ssh-keygen -Y sign -n megatron-env-bundle`)
  is verified against an allowed-signers file (`--trust`): a key the node trusts made it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from megatron_env import digest, files, proc
from megatron_env.errors import UserError

NAMESPACE = "megatron-env-bundle"


def sum_file(archive: Path) -> Path:
    return archive.with_name(archive.name + ".sha256")


def sig_file(archive: Path) -> Path:
    return archive.with_name(archive.name + ".sig")


def write_sum(archive: Path) -> str:
    """The archive's sha256, also written beside it in sha256sum's format (`sha256sum -c`)."""
    hexd = digest.file_hex(archive)
    files.write_text(sum_file(archive), f"{hexd}  {archive.name}\n")
    return hexd


def signing_key(key: Path) -> None:
    """Refuse a `--sign` key that ssh-keygen cannot read, before the bundle is made: found only
    at the end, it cost the whole download (gigabytes of wheels) first. `ssh-keygen -l` reads
    the key's public half as `-Y sign` does first, without a passphrase or an agent, so a
    key that passes here is one `sign` can use (a passphrase or an agent is asked for there)."""
    fix = "pass an OpenSSH private key (ssh-keygen -t ed25519 -f KEY)"
    if not key.is_file():
        raise UserError(f"signing key {key} does not exist", fix=fix, kind="bundle.sign-key")
    r = proc.run(["ssh-keygen", "-l", "-f", str(key)], timeout=60)
    if r.missing:
        raise UserError("--sign needs ssh-keygen, and it is not on PATH",
                        fix="install OpenSSH's client tools (ssh-keygen >= 8.1)",
                        kind="bundle.sign-failed")
    if not r.ok:
        raise UserError(f"signing key {key} is not a key ssh-keygen can read: {r.tail(1)}",
                        fix=fix, kind="bundle.sign-key")


def sign(archive: Path, key: Path) -> Path:
    """`ssh-keygen -Y sign` with the private key `key`: writes B.tar.sig."""
    signing_key(key)
    sig = sig_file(archive)
    sig.unlink(missing_ok=True)  # ssh-keygen refuses to overwrite
    r = proc.run(["ssh-keygen", "-Y", "sign", "-n", NAMESPACE, "-f", str(key), str(archive)],
                 timeout=300)
    if not r.ok or not sig.is_file():
        raise UserError(f"ssh-keygen -Y sign with {key} failed: {r.tail(2)}",
                        fix="check the key (a passphrase needs ssh-agent) and ssh-keygen >= 8.1",
                        kind="bundle.sign-failed")
    return sig


def _signer(archive: Path, sig: Path, allowed: Path) -> str:
    """The identity of `allowed` whose key made `sig` over `archive`; else refused."""
    found = proc.run(["ssh-keygen", "-Y", "find-principals", "-s", str(sig), "-f", str(allowed)],
                     timeout=60)
    identity = found.stdout.strip().splitlines()[0] if found.ok and found.stdout.strip() else ""
    if not identity:
        raise UserError(f"{sig.name} was not made by a key of {allowed}: nothing was unpacked",
                        fix="use a bundle signed by a trusted key, or add its signer to the "
                            "allowed-signers file", kind="bundle.untrusted")
    ok = proc.run(["ssh-keygen", "-Y", "verify", "-f", str(allowed), "-I", identity, "-n",
                   NAMESPACE, "-s", str(sig)], stdin_file=archive, timeout=600)
    if not ok.ok:
        raise UserError(f"{archive.name}: its signature {sig.name} does not verify "
                        f"(signer {identity}): the archive changed after it was signed; "
                        "nothing was unpacked", fix="fetch the bundle again from its maker",
                        kind="bundle.bad-signature")
    return identity


def check(paths: Sequence[Path], expect_sha256: Sequence[str] = (),
          trust: Path | None = None) -> str:
    """Each archive checked at the level asked for, before it is unpacked; -> a line saying the
    level used. `expect_sha256`: every archive's sha256 must be one of them; `trust`: every
    archive must carry a signature (B.tar.sig) by a key of that allowed-signers file."""
    if not expect_sha256 and trust is None:
        return "provenance: none (the manifest's hashes catch corruption, not tampering)"
    if trust is not None and not trust.is_file():
        raise UserError(f"allowed-signers file {trust} does not exist",
                        fix="pass a file of `IDENTITY KEYTYPE KEY` lines (ssh-keygen(1), "
                            "ALLOWED SIGNERS)", kind="bundle.trust-file")
    if dirs := [p for p in paths if p.is_dir()]:
        raise UserError(f"{dirs[0]} is an unpacked directory: its provenance cannot be checked",
                        fix="pass the .tar with its .sig / sha256", kind="bundle.provenance-dir")
    want = {h.strip().lower() for h in expect_sha256}
    said = []
    for p in paths:
        if want:
            got = digest.file_hex(p)
            if got not in want:
                raise UserError(f"{p.name} has sha256 {got}, not the expected "
                                f"{' or '.join(sorted(want))}: nothing was unpacked",
                                fix="fetch the bundle again, or check the sha256 you were given",
                                kind="bundle.sha256-mismatch")
        if trust is not None:
            sig = sig_file(p)
            if not sig.is_file():
                raise UserError(f"{p.name} is not signed (no {sig.name}) and --trust is set: "
                                "nothing was unpacked", fix="sign it where it is made: "
                                "`invoke bundle --sign KEY`", kind="bundle.unsigned")
            said.append(_signer(p, sig, trust))
    if trust is not None:
        return f"provenance: signature (signed by {', '.join(sorted(set(said)))})"
    return "provenance: sha256 (the archive is the one published)"
