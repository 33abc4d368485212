"""apex: NVIDIA's fused CUDA kernels that Megatron imports (fused layer norm, amp_C, softmax).

Its setup.py reads `--cpp_ext`, `--cuda_ext` ... from sys.argv, and from 2025-07 on also
APEX_CPP_EXT=1-style variables; pins older than that get the variables from
patches/apex/<commit>/0001-read-switches-from-environment.patch. pip >= 23.1 drops
`--global-option` with only a warning, leaving a Python-only apex: hence the variables, and the
check that every module of the chosen variants imports. Its CUDA/torch version check demands
nvcc == torch.version.cuda exactly (patched for minor mismatches on old pins).
"""

from megatron_env.recipes.recipe import Choice, Recipe, Variant

RECIPE = Recipe(
    name="apex",
    about="NVIDIA apex fused kernels (layer norm, amp_C, masked softmax, weight-gradient GEMM)",
    source="git",
    repo="https://github.com/NVIDIA/apex.git",
    archs_var="TORCH_CUDA_ARCH_LIST",
    archs_form="dotted",
    gib_per_job=3.0,
    # 25.09 reads it; patches/apex/52e18c89.../0003 backports it. megatron-env derives it with
    # MAX_JOBS from cores and memory (megatron_env/jobs.py).
    parallel_var="APEX_PARALLEL_BUILD",
    variants=(
        Variant("cpp_ext", "C++ helpers (flatten/unflatten)", env={"APEX_CPP_EXT": "1"},
                modules=("apex_C",), default=True),
        Variant("cuda_ext", "the fused CUDA kernels Megatron uses", env={"APEX_CUDA_EXT": "1"},
                modules=("amp_C", "fused_layer_norm_cuda", "fused_weight_gradient_mlp_cuda",
                         "scaled_masked_softmax_cuda", "scaled_upper_triang_masked_softmax_cuda",
                         "scaled_softmax_cuda"), default=True),
        Variant("fast_layer_norm", "contrib FastLayerNorm (Megatron core_v0.4.0 imports it)",
                env={"APEX_FAST_LAYER_NORM": "1"}, modules=("fast_layer_norm",)),
    ),
    # patches/apex/<commit>/*-build-only-chosen-extensions.patch: setup.py builds only these of
    # what the variants switch on; each chosen one must import. Megatron core_v0.19.0 imports
    # amp_C, fused_weight_gradient_mlp_cuda and the three scaled_*softmax_cuda itself and
    # fused_layer_norm_cuda through apex.normalization (the cuda_ext variant's modules); the
    # other five of --cuda_ext and apex_C of --cpp_ext it never imports.
    choices=(
        Choice("extensions", "compiled extensions to build of those the variants switch on",
               "APEX_EXTENSIONS",
               ("apex_C", "amp_C", "syncbn", "fused_layer_norm_cuda", "mlp_cuda",
                "fused_dense_cuda", "scaled_upper_triang_masked_softmax_cuda",
                "generic_scaled_masked_softmax_cuda", "scaled_masked_softmax_cuda",
                "scaled_softmax_cuda", "fused_rotary_positional_embedding",
                "fused_weight_gradient_mlp_cuda", "fast_layer_norm"), modules=True),
    ),
    requires=("packaging>20.6",),  # setup.py's install_requires (setup.py and apex import it)
    # the pool's order in a first build of a pin (kernels.schedule), one slot each on an H100
    # (bench/results/2026-12-06-h100-ac60c25): the longest the upper-triangular softmax kernel,
    # 106 s, then the plain and masked softmax kernels (82, 68 s), 24-58 s the others
    object_seconds=(("*/scaled_upper_triang_masked_softmax_cuda.o", 106.0),
                    ("*/scaled_softmax_cuda.o", 82.0), ("*/scaled_masked_softmax_cuda.o", 68.0),
                    ("*fused_weight_gradient_dense_cuda.o", 58.0),
                    ("*fused_weight_gradient_dense_16bit_prec_cuda.o", 55.0),
                    ("*softmax*", 40.0), ("*", 32.0)),
    gpu_check="apex",
    proves="FusedLayerNorm matches torch.nn.functional.layer_norm",
)
