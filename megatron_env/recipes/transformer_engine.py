"""transformer-engine: NVIDIA Transformer Engine for PyTorch (Megatron's TE layer spec).

Built from the git tag with two pinned submodules, each read by TE's CMake from a fixed path
(transformer_engine/common/CMakeLists.txt has no variable to point elsewhere):
- 3rdparty/cutlass (header-only GEMM templates): the build reads include/ and
  tools/util/include/ only (28 MiB of a repository whose depth-1 pack is ~29 MB compressed), so
  at TE's pin 57e3cfb4 those two paths are taken, pinned by their git tree id: `git archive`
  from the repository, or (offline) a tar of them in MEGATRON_ENV_SOURCE_CUTLASS_HEADERS.
- 3rdparty/cudnn-frontend: TE's pin e46d7082 (FE 1.25.0) is in no fetchable mirror (they end
  at v1.23.0), and the build reads only include/ (the headers) and cmake/cuDNN.cmake (the
  finder of cuDNN that defines CUDNN::cudnn_all). The headers come from NVIDIA's own release
  artefact of FE 1.25.0, the wheel nvidia-cudnn-frontend 1.25.0 (its include/ is the tag's: in
  1.23.0 all 92 headers have the tag's git blob ids; 1.25.0 adds node/rope*.h), pinned by
  sha256. The wheel has no cmake/ and 1.25.0 has no sdist, so cuDNN.cmake comes from v1.23.0
  (fb682ce7), pinned by tree id: TE's CMake did not change across FE 1.23 -> 1.25, it uses only
  CUDNN::cudnn_all, and every variant of the file finds and links the same cuDNN 9 libraries.
  Offline: MEGATRON_ENV_SOURCE_CUDNN_FRONTEND_HEADERS (the wheel) and
  MEGATRON_ENV_SOURCE_CUDNN_FRONTEND_CMAKE (a tar of cmake/cuDNN.cmake).
A profile pinning other submodule commits checks each submodule out whole from git, as before.
TE itself offline: MEGATRON_ENV_MIRROR_TRANSFORMER_ENGINE (a bare repository with the commit).

Switches: PyTorch only (otherwise it builds for every framework it can import, jax too); no
NCCL EP (on by default, it builds 3rdparty/nccl, needs NCCL >= 2.30 and is absent from release
tags); a version without `+<git sha>` (build_tools runs `git rev-parse` in whatever checkout
encloses the tree); never `git submodule update` during the build. The common library includes
<cudnn.h> and "nccl.h" but only its CMake is given cuDNN's directory, and nothing gives NCCL's:
the headers come from torch's own nvidia-cudnn and nvidia-nccl wheels through CPATH, and
CUDNN_PATH points CMake at the same cuDNN. Memory: the largest compile process on an H200 node
took 4.0 GiB.

`import transformer_engine` succeeds even when its PyTorch part fails (its __init__ swallows
the ImportError, e.g. pydantic missing), so the check imports transformer_engine.pytorch, which
loads libtransformer_engine.so and registers transformer_engine_torch. Both shared objects live
inside the transformer_engine package of the wheel.
"""

from megatron_env.recipes.recipe import Recipe, Resource

CUTLASS = "57e3cfb47a2d9e0d46eb6335c3dc411498efa198"  # TE v2.17.1's 3rdparty/cutlass
FRONTEND = "e46d7082450264ce05cf898f8740011c4896f817"  # TE v2.17.1's 3rdparty/cudnn-frontend

RECIPE = Recipe(
    name="transformer-engine",
    about="NVIDIA Transformer Engine, PyTorch part (Megatron's TE layer spec; fp8 on Hopper)",
    source="git",
    repo="https://github.com/NVIDIA/TransformerEngine.git",
    submodules={"3rdparty/cutlass": "https://github.com/NVIDIA/cutlass.git",
                "3rdparty/cudnn-frontend": "https://github.com/NVIDIA/cudnn-frontend.git"},
    resources=(
        Resource("cutlass-headers", "3rdparty/cutlass", "3rdparty/cutlass", CUTLASS,
                 ("include", "tools/util/include"),
                 "the build reads these two header trees only",
                 repo="https://github.com/NVIDIA/cutlass.git", commit=CUTLASS,
                 tree="4ae78f8521f265590718b6b14868cc7c61a0a007"),
        Resource("cudnn-frontend-headers", "3rdparty/cudnn-frontend", "3rdparty/cudnn-frontend",
                 FRONTEND, ("include",),
                 "FE 1.25.0's headers from its release wheel; the commit is in no mirror",
                 wheel="nvidia_cudnn_frontend-1.25.0-cp312-cp312-manylinux_2_27_x86_64."
                       "manylinux_2_28_x86_64.whl",
                 sha256="9a94a72d736bd79eb35f451aaf26d9493778e02ecabccc92c05425508c9e7a83"),
        Resource("cudnn-frontend-cmake", "3rdparty/cudnn-frontend", "3rdparty/cudnn-frontend",
                 FRONTEND, ("cmake/cuDNN.cmake",),
                 "the cuDNN finder TE's CMake includes; not in the wheel, same links since 1.19",
                 repo="https://github.com/NVIDIA/cudnn-frontend.git",
                 commit="fb682ce761a2705e40f9b5d528737a3e0eb33cec",  # v1.23.0
                 tree="0fdf136318fee402f6182cffbff27041dbe4d8a3"),
    ),
    # --split-compile: its longest objects (fused attention, casts) each hold many kernels
    env={"NVTE_FRAMEWORK": "pytorch", "NVTE_WITH_NCCL_EP": "0", "NVTE_NO_LOCAL_VERSION": "1",
         "NVTE_SKIP_SUBMODULE_CHECKS_DURING_BUILD": "1", "NVCC_APPEND_FLAGS": "--split-compile=4"},
    # build_tools (v2.17.1 utils.get_max_jobs_for_parallel_build) reads NVTE_BUILD_MAX_JOBS
    # before MAX_JOBS, skipping an empty one: empty, CMake gets `--parallel <MAX_JOBS>` (the
    # pool's width), and its ninja shows the pool every object. (0 gave a bare `--parallel`:
    # ninja's own default, 18 on 16 cores, since the isolated build's ninja comes before the
    # pool's shim on PATH; its longest objects reached the pool at 193-274 s.)
    pool_env={"NVTE_BUILD_MAX_JOBS": ""},
    site_paths={"CPATH": ("nvidia/cudnn/include", "nvidia/nccl/include"),
                "CUDNN_PATH": ("nvidia/cudnn",)},
    archs_var="NVTE_CUDA_ARCHS",
    archs_form="sm",
    gib_per_job=4.0,
    modules=("transformer_engine.pytorch", "transformer_engine_torch"),
    libraries=("transformer_engine/libtransformer_engine",
               "transformer_engine/transformer_engine_torch"),
    # setup.py's install_requires at v2.17.1 (setup_requirements + build_tools/pytorch.py), but
    # torch; `import transformer_engine.pytorch` fails without pydantic
    requires=("pydantic", "importlib-metadata>=1.0", "packaging", "einops", "onnxscript", "onnx",
              "nvdlfw-inspect"),
    # the pool's order in a first build of a pin (kernels.schedule), no ties among the long
    # objects: each CMake object's seconds on one slot of an H100 plus the ~57 s the torch
    # extension takes after the library (bench/results/2026-12-06-h100-ac60c25). Its longest:
    # cast_transpose_fusion 171 s, ln_fwd 144, gelu 131, relu 119, fused_topk 112, the grouped
    # GEMM 106, fused attention f16 105, swiglu 104. The extension's: pybind 56 s, quantizer
    # 38, the rest 22-31; tied at 30 s, pybind started last and ended at 476 s.
    object_seconds=(("transformer_engine/pytorch/csrc/extensions/pybind.o", 56.0),
                    ("transformer_engine/pytorch/csrc/quantizer.o", 38.0),
                    ("transformer_engine/pytorch/csrc/*", 30.0),
                    ("transpose/cast_transpose_fusion.cu.o", 228.0),
                    ("normalization/layernorm/ln_fwd_cuda_kernel.cu.o", 201.0),
                    ("activation/gelu.cu.o", 188.0), ("activation/relu.cu.o", 176.0),
                    ("fused_router/fused_topk_with_score_function.cu.o", 169.0),
                    ("gemm/cutlass_grouped_gemm.cu.o", 163.0),
                    ("fused_attn/fused_attn_f16_arbitrary_seqlen.cu.o", 162.0),
                    ("activation/swiglu.cu.o", 161.0), ("fused_attn/fused_attn_fp8.cu.o", 158.0),
                    ("normalization/layernorm/ln_bwd_semi_cuda_kernel.cu.o", 156.0),
                    ("transpose/quantize_transpose_vector_blockwise_fp4.cu.o", 153.0),
                    ("normalization/rmsnorm/rmsnorm_bwd_semi_cuda_kernel.cu.o", 143.0),
                    ("normalization/rmsnorm/rmsnorm_fwd_cuda_kernel.cu.o", 137.0),
                    ("normalization/*_kernel.cu.o", 134.0), ("fused_attn/utils.cu.o", 126.0),
                    ("activation/gelu_grouped.cu.o", 120.0),
                    ("activation/relu_grouped.cu.o", 119.0),
                    ("normalization/common.cpp.o", 117.0), ("fused_attn/*", 100.0),
                    ("fused_router/*", 95.0), ("activation/*", 90.0), ("*", 70.0)),
    gpu_check="transformer_engine",
    proves="bf16 te.Linear and te.LayerNormLinear forward and backward match fp32 PyTorch",
)
