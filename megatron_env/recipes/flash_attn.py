"""flash-attn: FlashAttention-2's CUDA kernels, built from the release sdist.

Its setup.py compares its switches with == "TRUE"; without FLASH_ATTENTION_FORCE_BUILD it
downloads a prebuilt wheel from GitHub releases instead of compiling (and before 2.5.9 an offline
DNS failure crashes the build). It ignores TORCH_CUDA_ARCH_LIST: the archs come from
FLASH_ATTN_CUDA_ARCHS (2.7.3 on; older pins get it from patches/flash-attn/<version>/). It has no
pyproject.toml and imports torch in setup.py, so even reading its metadata needs
FLASH_ATTENTION_SKIP_CUDA_BUILD.

Memory: one nvcc job compiles up to NVCC_THREADS archs at once, ~5 GiB each: 13 jobs for sm_90
alone peaked at 53 GiB together on an H200 node (bench/results/2026-12-02-h200-1gpu/flash-attn/
mem.log); flash-attn's own setup.py assumes 9 GiB a job at 4 threads.
"""

from megatron_env.recipes.recipe import Choice, Recipe

RECIPE = Recipe(
    name="flash-attn",
    about="FlashAttention-2 CUDA kernels (Megatron's --use-flash-attn)",
    source="sdist",
    sdist="flash_attn-{version}.tar.gz",
    # never fetch a prebuilt wheel; --split-compile: each of its few objects instantiates dozens
    # of kernels, and its longest (a split-KV forward) was 390 s of a 397 s build on an H200
    # node: nvcc optimises the kernels of one object on up to 8 threads
    env={"FLASH_ATTENTION_FORCE_BUILD": "TRUE", "NVCC_APPEND_FLAGS": "--split-compile=8"},
    metadata_env={"FLASH_ATTENTION_SKIP_CUDA_BUILD": "TRUE"},
    archs_var="FLASH_ATTN_CUDA_ARCHS",
    archs_form="sm",
    nvcc_threads=2,
    gib_per_job=5.0,
    modules=("flash_attn_2_cuda",),
    # patches/flash-attn/<version>/*-build-only-chosen-head-dims-and-dtypes.patch: setup.py
    # compiles only these kernels and a call needing another raises a RuntimeError naming it.
    # 160 and 224 exist up to 2.5.x only; setup.py refuses a value its version cannot build.
    choices=(
        Choice("hdims", "head dims to compile kernels for", "FLASH_ATTN_HDIMS",
               ("32", "64", "96", "128", "160", "192", "224", "256")),
        Choice("dtypes", "dtypes to compile kernels for", "FLASH_ATTN_DTYPES", ("fp16", "bf16")),
    ),
    requires=("einops",),  # setup.py's install_requires, but torch
    # the pool's order in a first build of a pin (kernels.schedule), no ties among the long
    # ones: one slot each on an H100 (bench/results/2026-12-06-h100-ac60c25, hdim 128 bf16),
    # the longest the non-causal split-KV forward, 324 s; the split ones before the plain ones
    # (fnmatch: the first pattern that matches)
    object_seconds=(("csrc/flash_attn/src/flash_fwd_split_*_causal_sm*.o", 200.0),
                    ("csrc/flash_attn/src/flash_fwd_split_*_sm*.o", 324.0),
                    ("csrc/flash_attn/src/flash_bwd_*_causal_sm*.o", 178.0),
                    ("csrc/flash_attn/src/flash_bwd_*_sm*.o", 265.0),
                    ("csrc/flash_attn/src/flash_fwd_*_causal_sm*.o", 176.0),
                    ("csrc/flash_attn/src/flash_fwd_*_sm*.o", 208.0),
                    ("csrc/flash_attn/src/*", 200.0), ("*", 30.0)),
    gpu_check="flash_attn",
    proves="causal bf16 forward and backward match torch's scaled_dot_product_attention",
)
