"""Kernel recipes: declared once, resolved against the profiles' [kernels.<name>] pins, listed,
and fetched with pinned submodules (real git, local repositories)."""

import re
import zipfile
from pathlib import Path

from megatron_env import profile, recipes
from megatron_env.commands import host
from megatron_env.findings import Finding
from megatron_env.kernels import build, compiler, source_trees
from megatron_env.recipes import recipe
from megatron_env.setup import pipeline

from .conftest import user_error
from .gitrepo import git, with_submodule

PACKAGE = Path(recipes.__file__).parent.parent


def test_no_module_but_the_recipes_names_a_kernel_package():
    names = set()
    for r in recipes.declared().values():
        names |= {r.name, r.name.replace("-", "_"), *r.modules}
        names |= {m for v in r.variants for m in v.modules}
    pattern = re.compile("|".join(rf"\b{re.escape(n)}\b" for n in sorted(names)), re.I)
    offenders = [f"{p.relative_to(PACKAGE)}:{n}: {line.strip()}"
                 for p in sorted(PACKAGE.rglob("*.py")) if p.parent.name != "recipes"
                 for n, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert offenders == []


def test_current_profile_resolves_its_pins_and_variants():
    pk = build.packages(profile.load("core_v0.19.0-cu130"))
    fa, ax = pk["flash-attn"], pk["apex"]
    assert (fa.pin, fa.source.url) == ("2.8.3", "flash_attn-2.8.3.tar.gz")
    assert fa.variants == ("hdims=128", "dtypes=bf16")  # the kernels the profile's GPTs run
    assert fa.switches == {"FLASH_ATTENTION_FORCE_BUILD": "TRUE", "FLASH_ATTN_CUDA_ARCHS": "90",
                           "NVCC_APPEND_FLAGS": "--split-compile=8",
                           "NVCC_THREADS": "2", "FLASH_ATTN_HDIMS": "128",
                           "FLASH_ATTN_DTYPES": "bf16"}
    assert fa.metadata_env == {"FLASH_ATTENTION_SKIP_CUDA_BUILD": "TRUE"}
    assert ax.pin == ax.source.commit == "4bdecd06b3c4b2c0a8fb6603829a8f9f05a42b49"
    assert ax.source.repo == "https://github.com/NVIDIA/apex.git"
    # what Megatron core_v0.19.0 imports of apex, and no more (kernels.imports checks it)
    megatron_uses = ("amp_C", "fused_layer_norm_cuda", "fused_weight_gradient_mlp_cuda",
                     "scaled_masked_softmax_cuda", "scaled_softmax_cuda",
                     "scaled_upper_triang_masked_softmax_cuda")
    assert ax.variants == ("cuda_ext", "extensions=" + ",".join(megatron_uses))
    assert sorted(ax.modules) == sorted(megatron_uses) and ax.gb_per_job == 3.0
    assert ax.switches["APEX_EXTENSIONS"] == ",".join(megatron_uses)
    assert "APEX_CPP_EXT" not in ax.switches
    assert ax.parallel_var == "APEX_PARALLEL_BUILD" and fa.parallel_var == ""
    old = build.packages(profile.load("core_v0.4.0-cu121"))["flash-attn"]
    assert old.variants == ("hdims=all", "dtypes=all")  # unset: every kernel, as upstream
    assert (old.switches["FLASH_ATTN_HDIMS"], old.switches["FLASH_ATTN_DTYPES"]) == ("all", "all")


def test_choices_take_listed_values_only(tmp_path):
    text = profile.load("core_v0.19.0-cu130").path.read_text()
    (tmp_path / "p").mkdir()
    bad = tmp_path / "p" / "profile.toml"
    bad.write_text(text.replace('hdims = ["128"]', 'hdims = ["100"]'))
    with user_error("profile.invalid") as e:
        profile.load_file(bad)
    assert "kernels.flash-attn.hdims" in e.value.message and "all, 32, 64, 96, 128" in e.value.message
    r = recipe.Recipe("tiny", "a test recipe", "git", repo="/nowhere", choices=(
        recipe.Choice("sizes", "x", "TINY_SIZES", ("1", "2", "3")),))
    p = recipe.resolve(r, {"commit": "a" * 40, "sizes": ["1", "3"]}, ["9.0"])
    assert (p.switches, p.variants) == ({"TINY_SIZES": "1,3"}, ("sizes=1,3",))


def test_a_module_choice_must_keep_what_its_variants_need():
    """apex's extensions: the chosen ones must import; leaving out one its chosen variant
    needs (cuda_ext: what Megatron imports) is refused before anything builds; "all" says
    nothing to the build (every extension the variants switch on)."""
    ax = recipes.get("apex")
    pins = {"commit": "a" * 40, "variants": ["cuda_ext"]}
    some = ["amp_C", "fused_layer_norm_cuda", "fused_weight_gradient_mlp_cuda",
            "scaled_masked_softmax_cuda", "scaled_softmax_cuda",
            "scaled_upper_triang_masked_softmax_cuda", "syncbn"]
    p = recipe.resolve(ax, {**pins, "extensions": some}, ["9.0"])
    assert "syncbn" in p.modules and p.switches["APEX_EXTENSIONS"] == ",".join(some)
    with user_error("recipe.choice-incomplete") as e:
        recipe.resolve(ax, {**pins, "extensions": some[1:]}, ["9.0"])
    assert "amp_C" in e.value.message and "cuda_ext" in e.value.message
    every = recipe.resolve(ax, pins, ["9.0"])
    assert "APEX_EXTENSIONS" not in every.switches and "syncbn" not in every.modules


def test_the_compiled_modules_megatron_imports_must_be_built(tmp_path):
    """Real Megatron core_v0.19.0 files (tests/fixtures/megatron-imports): amp_C and the three
    scaled_*softmax_cuda are imported; one left out of apex's build is named with its line; a
    kernel the profile does not build is not looked at."""
    from megatron_env.kernels import imports

    src = Path(__file__).parent / "fixtures" / "megatron-imports" / "megatron"
    root = tmp_path / "megatron"
    for f in src.rglob("*.py.txt"):
        (root / f.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
        (root / f.relative_to(src)).with_suffix("").write_bytes(f.read_bytes())
    found = imports.imported(root, imports.compiled_modules(["apex"]))
    assert found == {"amp_C": "core/optimizer/clip_grads.py:23",
                     "scaled_upper_triang_masked_softmax_cuda": "core/fusions/fused_softmax.py:31",
                     "scaled_masked_softmax_cuda": "core/fusions/fused_softmax.py:81",
                     "scaled_softmax_cuda": "core/fusions/fused_softmax.py:127"}
    built = build.packages(profile.load("core_v0.19.0-cu130"))["apex"].modules
    assert imports.not_built(root, ["apex"], built) == {}
    assert imports.not_built(root, ["apex"], set(built) - {"amp_C"}) == {
        "amp_C": "core/optimizer/clip_grads.py:23"}
    assert imports.not_built(root, [], set()) == {}


TE_COMMIT = "4329ff84bfbdaa778a33cba02a15fb0807c64689"
TE_SUBMODULES = {"3rdparty/cutlass": "57e3cfb47a2d9e0d46eb6335c3dc411498efa198",
                 "3rdparty/cudnn-frontend": "e46d7082450264ce05cf898f8740011c4896f817"}


def test_transformer_engine_resolves_with_pinned_submodules():
    te = build.packages(profile.load("core_v0.19.0-cu130"))["transformer-engine"]
    assert (te.pin, te.source.tag) == (TE_COMMIT, "v2.17.1")
    # at TE's own pins both submodules are stood in for by pinned content (recipe: why)
    assert te.source.submodules == ()
    assert [(r.replaces, r.when, r.take) for r in te.source.resources] == [
        ("3rdparty/cutlass", TE_SUBMODULES["3rdparty/cutlass"], ("include", "tools/util/include")),
        ("3rdparty/cudnn-frontend", TE_SUBMODULES["3rdparty/cudnn-frontend"], ("include",)),
        ("3rdparty/cudnn-frontend", TE_SUBMODULES["3rdparty/cudnn-frontend"],
         ("cmake/cuDNN.cmake",))]
    assert te.source.digest == (
        f"git:{TE_COMMIT}+3rdparty/cutlass<tree:4ae78f8521f265590718b6b14868cc7c61a0a007"
        "+3rdparty/cudnn-frontend<sha256:9a94a72d736bd79eb35f451aaf26d9493778e02ecabccc92c05425508c9e7a83"
        "+3rdparty/cudnn-frontend<tree:0fdf136318fee402f6182cffbff27041dbe4d8a3")
    assert te.switches == {"NVTE_FRAMEWORK": "pytorch", "NVTE_WITH_NCCL_EP": "0",
                           "NVTE_NO_LOCAL_VERSION": "1",
                           "NVTE_SKIP_SUBMODULE_CHECKS_DURING_BUILD": "1", "NVTE_CUDA_ARCHS": "90",
                           "NVCC_APPEND_FLAGS": "--split-compile=4"}
    assert te.modules == ("transformer_engine.pytorch", "transformer_engine_torch")
    # both shared objects sit inside the package, not where the module names would put them
    assert te.wheel_libraries == ("transformer_engine/libtransformer_engine",
                                  "transformer_engine/transformer_engine_torch")
    assert te.gb_per_job == 4.0
    assert "transformer-engine" not in build.packages(profile.load("core_v0.4.0-cu121"))


def test_wheel_check_looks_for_the_declared_libraries(tmp_path):
    te = build.packages(profile.load("core_v0.19.0-cu130"))["transformer-engine"]
    wheel = tmp_path / "transformer_engine-2.17.1-cp312-cp312-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("transformer_engine/__init__.py", "")
        z.writestr("transformer_engine/libtransformer_engine.so", "")
        z.writestr("transformer_engine/pytorch/__init__.py", "")
    assert compiler.missing_libraries(wheel, te.wheel_libraries) == [
        "transformer_engine/transformer_engine_torch"]
    with zipfile.ZipFile(wheel, "a") as z:
        z.writestr("transformer_engine/transformer_engine_torch.cpython-312-x86_64-linux-gnu.so",
                   "")
    assert compiler.missing_libraries(wheel, te.wheel_libraries) == []


def _toolkit(root: Path) -> Path:
    """A CUDA home whose nvcc prints what the H200 node's nvcc 13.0 printed."""
    release = Path(__file__).parent / "fixtures" / "h200-live" / "nvcc-version.txt"
    (root / "bin").mkdir(parents=True)
    (root / "include").mkdir()
    (root / "include" / "cuda_runtime.h").write_text("")
    (root / "bin" / "nvcc").write_text(f"#!/bin/sh\ncat '{release}'\n")
    (root / "bin" / "nvcc").chmod(0o755)
    return root


def test_transformer_engine_plan_takes_headers_from_the_environments_wheels(tmp_path,
                                                                          monkeypatch):
    te = build.packages(profile.load("core_v0.19.0-cu130"))["transformer-engine"]
    monkeypatch.setenv("CUDA_HOME", str(_toolkit(tmp_path / "cuda-13.0")))
    monkeypatch.setenv("MAX_JOBS", "16")
    monkeypatch.setenv("CPATH", "/opt/site/include")
    keys = []
    for env in ("a", "b"):
        site = tmp_path / env / "site-packages"
        for d in ("nvidia/cudnn/include", "nvidia/nccl/include"):
            (site / d).mkdir(parents=True)
        facts = {"torch": "2.11.0+cu130", "cuda": "13.0", "abi": 1, "tag": "cpython-312",
                 "platlib": str(site)}
        p = build.plan(te, Path("/nonexistent/python"), ["9.0"], facts=facts)
        assert p.env["CPATH"] == (f"{site}/nvidia/cudnn/include:{site}/nvidia/nccl/include:"
                                  "/opt/site/include")
        assert p.env["CUDNN_PATH"] == f"{site}/nvidia/cudnn"
        assert (p.env["NVTE_CUDA_ARCHS"], p.env["TORCH_CUDA_ARCH_LIST"]) == ("90", "9.0")
        assert p.env["CUDA_HOME"] == str(tmp_path / "cuda-13.0")
        flags = next(line for line in p.lines() if line.startswith("  flags"))
        assert f"CUDNN_PATH={site}/nvidia/cudnn" in flags and "NVTE_WITH_NCCL_EP=0" in flags
        keys.append(p.key)
    # where the environment lives is not an input of the wheel: one key for both
    assert keys[0] == keys[1] and keys[0].startswith("transformer-engine-")
    archs = ["9.0", "10.0"]
    both = build.packages(profile.load("core_v0.19.0-cu130"), archs)["transformer-engine"]
    other = build.plan(both, Path("/nonexistent/python"), archs, facts=facts)
    assert other.env["NVTE_CUDA_ARCHS"] == "90;100" and other.key != keys[0]
    (site / "nvidia/nccl/include").rmdir()
    with user_error("build.site-paths") as e:
        build.plan(te, Path("/nonexistent/python"), ["9.0"], facts=facts)
    assert e.value.message.endswith("b/site-packages/nvidia/nccl/include")  # the one absent


def test_transformer_engine_table_must_pin_every_submodule(tmp_path):
    src = (profile.envs_root() / "core_v0.19.0-cu130" / "profile.toml").read_text()
    (tmp_path / "p").mkdir()
    path = tmp_path / "p" / "profile.toml"
    line = f'"3rdparty/cudnn-frontend" = "{TE_SUBMODULES["3rdparty/cudnn-frontend"]}"'
    assert line in src
    path.write_text(src.replace(line, ""))
    with user_error("profile.invalid") as e:
        profile.load_file(path)
    assert "kernels.transformer-engine.submodules.3rdparty/cudnn-frontend" in e.value.message
    path.write_text(src.replace(line, '"3rdparty/cudnn-frontend" = "v1.25.0"'))
    with user_error("profile.invalid") as e:
        profile.load_file(path)
    assert "v1.25.0" in e.value.message


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
    assert host.kernels() == 0
    out = capsys.readouterr().out
    lines = [" ".join(line.split()) for line in out.splitlines()]
    assert "apex git NVIDIA apex fused kernels (layer norm, amp_C, masked softmax, " \
           "weight-gradient GEMM)" in lines
    assert "variants cpp_ext*, cuda_ext*, fast_layer_norm" in lines
    assert "core_v0.4.0-cu121 52e18c894223 +cpp_ext +cuda_ext +fast_layer_norm" in lines
    assert "core_v0.19.0-cu130 25.09 @ 4bdecd06b3c4 +cuda_ext +extensions=amp_C," \
           "fused_layer_norm_cuda,fused_weight_gradient_mlp_cuda,scaled_masked_softmax_cuda," \
           "scaled_softmax_cuda,scaled_upper_triang_masked_softmax_cuda" in lines
    assert "core_v0.19.0-cu130 2.8.3 +hdims=128 +dtypes=bf16" in lines
    assert "hdims 32, 64, 96, 128, 160, 192, 224, 256 (default all)" in lines
    assert "core_v0.19.0-cu130 v2.17.1 @ 4329ff84bfbd" in lines
    assert lines[-1].startswith("3 kernel recipes")


def test_build_names_unknown_and_unpinned_recipes(tmp_path):
    prof = profile.load("core_v0.4.0-cu121")
    with user_error("recipe.unknown") as e:
        build.selected(prof, "flash", prof.archs)
    assert all(n in e.value.message for n in ("'flash'", *recipes.declared()))
    text = prof.path.read_text()
    start = text.index("[kernels.flash-attn]")
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "profile.toml").write_text(text[:start] + text[text.index("[kernels.apex]"):])
    lean = profile.load_file(tmp_path / "p" / "profile.toml")
    assert [p.name for p in build.selected(lean, "all", lean.archs)] == ["apex"]
    with user_error("recipe.not-pinned") as e:
        build.selected(lean, "flash-attn", lean.archs)
    assert "[kernels.flash-attn]" in e.value.fix


def test_git_source_with_pinned_submodules(tmp_path, monkeypatch):
    monkeypatch.setenv(build.CACHE_DIR_ENV, str(tmp_path / "cache"))
    top_repo, top, headers, first = with_submodule(tmp_path)
    r = recipe.Recipe("withsub", "a test recipe", "git", repo=str(top_repo),
                      submodules={"third_party/headers": str(headers)})
    pins = {"commit": top, "submodules": {"third_party/headers": first}}
    pkg = recipe.resolve(r, pins, [])
    assert pkg.source.digest == f"git:{top}+third_party/headers@{first}"
    tree = source_trees.fetch(pkg, echo=lambda *_: None)
    assert (tree / "third_party/headers/include/h.h").read_text() == "// one\n"
    assert (tree / "setup.py").exists()
    # pinning the submodule elsewhere is another source: another tree
    second = git("rev-parse", "HEAD", cwd=headers)
    moved = recipe.resolve(r, {**pins, "submodules": {"third_party/headers": second}}, [])
    other = source_trees.fetch(moved, echo=lambda *_: None)
    assert other != tree and (other / "third_party/headers/include/h.h").read_text() == "// two\n"


def test_submodule_pins_are_validated(tmp_path, monkeypatch):
    r = recipe.Recipe("withsub", "a test recipe", "git", repo="/x",
                      submodules={"3rdparty/cutlass": "/y"})
    monkeypatch.setitem(recipes.declared(), "withsub", r)
    src = (profile.envs_root() / "core_v0.4.0-cu121" / "profile.toml").read_text()
    (tmp_path / "p").mkdir()
    path = tmp_path / "p" / "profile.toml"
    path.write_text(src + f'\n[kernels.withsub]\ncommit = "{"b" * 40}"\n')
    with user_error("profile.invalid") as e:
        profile.load_file(path)
    assert "[kernels.withsub.submodules]" in e.value.message
    path.write_text(src + f'\n[kernels.withsub]\ncommit = "{"b" * 40}"\n'
                          '[kernels.withsub.submodules]\n"3rdparty/cutlass" = "v3.9"\n')
    with user_error("profile.invalid") as e:
        profile.load_file(path)
    assert "kernels.withsub.submodules.3rdparty/cutlass" in e.value.message


def test_setup_decides_before_it_runs(tmp_path):
    """Deciding reads stamps, digests and findings only, and runs nothing: after stamping the
    digests it returned, a second decision says `verify` for those steps."""
    prof = profile.load("core_v0.4.0-cu121")
    ctx = pipeline.Context(prof, tmp_path / "env")
    ctx.stamps.mkdir(parents=True)
    ctx.findings = [Finding("driver.version", "pass", "driver ok"),
                    Finding("cuda.toolkit", "pass", "toolkit ok")]
    first = {d.step.name: d for d in pipeline.decide(ctx, pipeline.STEPS)}
    assert {n: d.action.value for n, d in first.items()} == {
        "check": "run", "lock": "run", "env": "run", "sources": "run", "patches": "run",
        "builds": "run", "megatron": "run", "verify": "run"}
    assert first["env"].why == "no stamp"
    for d in first.values():
        if d.digest:
            (ctx.stamps / f"{d.step.name}.json").write_text(f'{{"digest": "{d.digest}"}}')
    second = {d.step.name: d.action.value for d in pipeline.decide(ctx, pipeline.STEPS)}
    assert second["env"] == second["builds"] == second["megatron"] == "verify"
    ctx.no_builds = True
    third = {d.step.name: d for d in pipeline.decide(ctx, ["builds", "megatron"])}
    assert third["builds"].action.value == "skip" and third["builds"].why == "--no-builds given"
    # a skipped step passes its stamp on, as an unchosen one does: the builds it stamped are
    # still installed, and what follows them is as it was
    assert third["env"].action.value == "unchosen" and third["megatron"].action.value == "verify"


def test_recipes_declare_what_their_packages_import_at_run_time():
    pk = build.packages(profile.load("core_v0.19.0-cu130"))
    assert "pydantic" in pk["transformer-engine"].requires  # import transformer_engine.pytorch
    assert pk["flash-attn"].requires == ("einops",)
    assert all("torch" not in r.split(">")[0].split("=")[0] for k in pk.values()
               for r in k.requires)  # the environment's torch is never moved
