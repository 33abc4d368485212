"""Profile loading: the shipped profiles load, and every kind of mistake names file and key."""

import pytest

from megatron_env import profile
from megatron_env.errors import UserError


def test_shipped_profiles():
    names = profile.names()
    assert names == ["core_v0.19.0-cu130", "core_v0.4.0-cu121"]
    default = profile.load()
    assert (default.name, default.python, default.torch, default.cuda) == (
        "core_v0.4.0-cu121", "3.10", "2.1.0", "12.1")
    assert default.megatron["commit"] == "38879f8b3f0edc4ed4f50ac2f3271010b12c549f"
    assert default.archs == ["8.0", "9.0"] and default.min_driver == "530.30.02"
    current = profile.load("core_v0.19.0-cu130")
    assert (current.python, current.cuda, current.megatron["tag"]) == ("3.12", "13.0", "core_v0.19.0")


def write_variant(tmp_path, old: str, new: str):
    src = (profile.envs_root() / "core_v0.4.0-cu121" / "profile.toml").read_text()
    assert old in src
    d = tmp_path / "envs" / "broken"
    d.mkdir(parents=True)
    (d / "profile.toml").write_text(src.replace(old, new, 1))
    return d / "profile.toml"


@pytest.mark.parametrize("old, new, words", [
    ('commit = "38879f8b3f0edc4ed4f50ac2f3271010b12c549f"', 'commit = "38879f8"',
     "megatron.commit: expected a commit of 40 lowercase hex digits, got '38879f8'"),
    ('version = "2.1.0"', 'version = "two.one"', "torch.version: expected a version"),
    ('version = "3.10"', "version = 3.10", "python.version: expected a string in quotes, e.g. \"3.10\""),
    ("[torch]", "colour = 'red'\n[torch]", "cuda.colour: expected one of the known keys"),
    ('min_driver = "530.30.02"', 'min_driver = "new"', "cuda.min_driver: expected a driver version"),
    ('archs = ["8.0", "9.0"]', 'archs = ["sm_90"]', "cuda.archs: expected a compute capability"),
    ('default = true', 'default = "yes"', "default: expected a bool"),
    ("[kernels.apex]", "[kernels.apex\n", "not valid TOML"),
    ("[kernels.apex]", "[kernels.apexx]\ncommit = 'x'\n[kernels.apex]",
     "[kernels.apexx]: expected a declared recipe (apex, flash-attn, "
     "transformer-engine)"),
    ('variants = ["cpp_ext", "cuda_ext", "fast_layer_norm"]', 'variants = ["cuda"]',
     "kernels.apex.variants: expected one of cpp_ext, cuda_ext, fast_layer_norm for every item "
     "(got 'cuda')"),
    ('sha256 = "2e5b2bcf', 'sha256 = "2E5B2BCF', "kernels.flash-attn.sha256: expected a sha256"),
    ('commit = "52e18c894223800cb611682dce27d88050edf1de"', 'tag = "23.08"',
     "kernels.apex.commit: expected a str (missing)"),
    ('version = "2.5.8"', 'version = "2.5.8"\nrepo = "x"',
     "kernels.flash-attn.repo: expected one of the known keys"),
])
def test_bad_profiles_name_file_and_key(tmp_path, old, new, words):
    path = write_variant(tmp_path, old, new)
    with pytest.raises(UserError) as e:
        profile.load_file(path)
    assert e.value.kind == ("profile.toml" if words == "not valid TOML" else "profile.invalid")
    assert str(path) in e.value.message and words in e.value.message  # names file and key


def test_toml_error_names_the_line(tmp_path):
    path = write_variant(tmp_path, "[kernels.apex]", "[kernels.apex\n")
    with pytest.raises(UserError, match=r"line \d+") as e:
        profile.load_file(path)
    assert e.value.kind == "profile.toml"


def test_unknown_profile_lists_known(tmp_path):
    with pytest.raises(UserError) as e:
        profile.load("core_v9")
    assert e.value.kind == "profile.unknown"
    assert "core_v0.19.0-cu130" in e.value.message and "core_v0.4.0-cu121" in e.value.message
