"""Kernel recipes: declared once, resolved against the profiles' [kernels.<name>] pins, listed,
and fetched with pinned submodules (real git, local repositories)."""

import re
from pathlib import Path

import pytest

from megatron_env import build, commands, pipeline, profile, recipe, recipes
from megatron_env.errors import UserError
from megatron_env.findings import Finding

from .gitrepo import git, repo_with

PACKAGE = Path(recipes.__file__).parent.parent


def test_no_module_but_the_recipes_names_a_kernel_package():
    names = set()
    for r in recipes.declared().values():
        names |= {r.name, r.name.replace("-", "_"), *r.modules}
        names |= {m for v in r.variants for m in v.modules}
    pattern = re.compile("|".join(rf"\b{re.escape(n)}\b" for n in sorted(names)), re.I)
    offenders = [f"{p.relative_to(PACKAGE)}:{n}: {line.strip()}"
                 for p in sorted(PACKAGE.glob("*.py"))
                 for n, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert offenders == []


def test_current_profile_resolves_its_pins_and_variants():
    pk = build.packages(profile.load("core_v0.19.0-cu130"))
    fa, ax = pk["flash-attn"], pk["apex"]
    assert (fa.pin, fa.source.url, fa.variants) == ("2.8.3", "flash_attn-2.8.3.tar.gz", ())
    assert fa.switches == {"FLASH_ATTENTION_FORCE_BUILD": "TRUE", "FLASH_ATTN_CUDA_ARCHS": "90",
                           "NVCC_THREADS": "2"}
    assert fa.metadata_env == {"FLASH_ATTENTION_SKIP_CUDA_BUILD": "TRUE"}
    assert ax.pin == ax.source.commit == "4bdecd06b3c4b2c0a8fb6603829a8f9f05a42b49"
    assert ax.source.repo == "https://github.com/NVIDIA/apex.git"
    assert ax.variants == ("cpp_ext", "cuda_ext") and "fast_layer_norm" not in ax.modules
    assert ax.modules[:2] == ("apex_C", "amp_C") and ax.gb_per_job == 3.0


def test_variants_default_and_build_options():
    r = recipe.Recipe("tiny", "a test recipe", "git", repo="/nowhere", build_options=("--cpp",),
                      modules=("tiny._C",), variants=(
                          recipe.Variant("fast", "x", build_options=("--fast",),
                                         modules=("tiny._fast",), default=True),
                          recipe.Variant("slow", "y", env={"SLOW": "1"}, modules=("tiny._C",))))
    p = recipe.resolve(r, {"commit": "a" * 40}, ["9.0"])
    assert (p.variants, p.build_options, p.modules) == (("fast",), ("--cpp", "--fast"),
                                                        ("tiny._C", "tiny._fast"))
    p = recipe.resolve(r, {"commit": "a" * 40, "variants": ["slow"]}, ["9.0"])
    assert (p.switches, p.build_options, p.modules) == ({"SLOW": "1"}, ("--cpp",), ("tiny._C",))
    assert p.source.digest == "git:" + "a" * 40


def test_listing_shows_every_recipe_with_each_profiles_pins(capsys):
    assert commands.kernels() == 0
    out = capsys.readouterr().out
    lines = [" ".join(line.split()) for line in out.splitlines()]
    assert "apex git NVIDIA apex fused kernels (layer norm, amp_C, masked softmax, " \
           "weight-gradient GEMM)" in lines
    assert "variants cpp_ext*, cuda_ext*, fast_layer_norm" in lines
    assert "core_v0.4.0-cu121 52e18c894223 +cpp_ext +cuda_ext +fast_layer_norm" in lines
    assert "core_v0.19.0-cu130 25.09 @ 4bdecd06b3c4 +cpp_ext +cuda_ext" in lines
    assert "core_v0.19.0-cu130 2.8.3" in lines
    assert lines[-1].startswith("2 kernel recipes")


def test_build_names_unknown_and_unpinned_recipes(tmp_path):
    prof = profile.load("core_v0.4.0-cu121")
    with pytest.raises(UserError, match="no recipe named 'flash'; declared: apex, flash-attn"):
        build.selected(prof, "flash", prof.archs)
    text = prof.path.read_text()
    start = text.index("[kernels.flash-attn]")
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "profile.toml").write_text(text[:start] + text[text.index("[kernels.apex]"):])
    lean = profile.load_file(tmp_path / "p" / "profile.toml")
    assert [p.name for p in build.selected(lean, "all", lean.archs)] == ["apex"]
    with pytest.raises(UserError, match="profile p pins no flash-attn") as e:
        build.selected(lean, "flash-attn", lean.archs)
    assert "[kernels.flash-attn]" in e.value.fix


def test_git_source_with_pinned_submodules(tmp_path, monkeypatch):
    monkeypatch.setenv(build.CACHE_DIR_ENV, str(tmp_path / "cache"))
    headers = tmp_path / "headers"
    first = repo_with(headers, {"include/h.h": "// one\n"})
    (headers / "include/h.h").write_text("// two\n")
    git("commit", "-qam", "two", cwd=headers)  # the submodule moved on; the pin did not
    top = repo_with(tmp_path / "top", {"setup.py": ""})
    r = recipe.Recipe("withsub", "a test recipe", "git", repo=str(tmp_path / "top"),
                      submodules={"third_party/headers": str(headers)})
    pins = {"commit": top, "submodules": {"third_party/headers": first}}
    pkg = recipe.resolve(r, pins, [])
    assert pkg.source.digest == f"git:{top}+third_party/headers@{first}"
    tree = build.fetch(pkg, Path("/nonexistent/python"), echo=lambda *_: None)
    assert (tree / "third_party/headers/include/h.h").read_text() == "// one\n"
    assert (tree / "setup.py").exists()
    # pinning the submodule elsewhere is another source: another tree
    second = git("rev-parse", "HEAD", cwd=headers)
    moved = recipe.resolve(r, {**pins, "submodules": {"third_party/headers": second}}, [])
    other = build.fetch(moved, Path("/nonexistent/python"), echo=lambda *_: None)
    assert other != tree and (other / "third_party/headers/include/h.h").read_text() == "// two\n"


def test_submodule_pins_are_validated(tmp_path, monkeypatch):
    r = recipe.Recipe("withsub", "a test recipe", "git", repo="/x",
                      submodules={"3rdparty/cutlass": "/y"})
    monkeypatch.setitem(recipes.declared(), "withsub", r)
    src = (profile.ENVS_DIR / "core_v0.4.0-cu121" / "profile.toml").read_text()
    (tmp_path / "p").mkdir()
    path = tmp_path / "p" / "profile.toml"
    path.write_text(src + f'\n[kernels.withsub]\ncommit = "{"b" * 40}"\n')
    with pytest.raises(UserError, match=r"\[kernels.withsub.submodules\]: expected a table"):
        profile.load_file(path)
    path.write_text(src + f'\n[kernels.withsub]\ncommit = "{"b" * 40}"\n'
                          '[kernels.withsub.submodules]\n"3rdparty/cutlass" = "v3.9"\n')
    with pytest.raises(UserError, match="kernels.withsub.submodules.3rdparty/cutlass: expected a "
                                        "commit of 40"):
        profile.load_file(path)


def test_setup_decides_before_it_runs(tmp_path):
    """Deciding reads stamps, digests and findings only, and runs nothing: after stamping the
    digests it returned, a second decision says `verify` for those steps."""
    prof = profile.load("core_v0.4.0-cu121")
    ctx = pipeline.Context(prof, tmp_path / "env")
    ctx.stamps.mkdir(parents=True)
    ctx.findings = [Finding("driver.version", "pass", "driver ok"),
                    Finding("cuda.toolkit", "pass", "toolkit ok")]
    first = {d.step.name: d for d in pipeline.decide(ctx, pipeline.STEPS)}
    assert {n: d.action for n, d in first.items()} == {
        "check": "run", "lock": "run", "env": "run", "sources": "run", "patches": "run",
        "builds": "run", "megatron": "run", "verify": "run"}
    assert first["env"].why == "no stamp"
    for d in first.values():
        if d.digest:
            (ctx.stamps / f"{d.step.name}.json").write_text(f'{{"digest": "{d.digest}"}}')
    second = {d.step.name: d.action for d in pipeline.decide(ctx, pipeline.STEPS)}
    assert second["env"] == second["builds"] == second["megatron"] == "verify"
    ctx.no_builds = True
    third = {d.step.name: d for d in pipeline.decide(ctx, ["builds", "megatron"])}
    assert third["builds"].action == "skip" and third["builds"].why == "--no-builds given"
    # a skipped step passes no digest on: what follows it is decided anew
    assert third["env"].action == "unchosen" and third["megatron"].action == "run"
