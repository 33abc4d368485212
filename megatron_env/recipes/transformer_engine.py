"""transformer-engine: NVIDIA Transformer Engine for PyTorch (Megatron's TE layer spec).

Built from the git tag with two pinned submodules: cutlass (header-only GEMM templates) and
cudnn-frontend (headers and the CMake finder of cuDNN, at the fixed path
3rdparty/cudnn-frontend; TE's CMake has no variable to point elsewhere). Offline, each comes
from a local bare repository holding the pinned commit: MEGATRON_ENV_MIRROR_TRANSFORMER_ENGINE,
..._TRANSFORMER_ENGINE_3RDPARTY_CUTLASS and ..._TRANSFORMER_ENGINE_3RDPARTY_CUDNN_FRONTEND.

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

from megatron_env.recipes.recipe import Recipe

RECIPE = Recipe(
    name="transformer-engine",
    about="NVIDIA Transformer Engine, PyTorch part (Megatron's TE layer spec; fp8 on Hopper)",
    source="git",
    repo="https://github.com/NVIDIA/TransformerEngine.git",
    submodules={"3rdparty/cutlass": "https://github.com/NVIDIA/cutlass.git",
                "3rdparty/cudnn-frontend": "https://github.com/NVIDIA/cudnn-frontend.git"},
    env={"NVTE_FRAMEWORK": "pytorch", "NVTE_WITH_NCCL_EP": "0", "NVTE_NO_LOCAL_VERSION": "1",
         "NVTE_SKIP_SUBMODULE_CHECKS_DURING_BUILD": "1"},
    site_paths={"CPATH": ("nvidia/cudnn/include", "nvidia/nccl/include"),
                "CUDNN_PATH": ("nvidia/cudnn",)},
    archs_var="NVTE_CUDA_ARCHS",
    archs_form="sm",
    gib_per_job=4.0,
    modules=("transformer_engine.pytorch", "transformer_engine_torch"),
    libraries=("transformer_engine/libtransformer_engine",
               "transformer_engine/transformer_engine_torch"),
    gpu_check="transformer_engine",
    proves="bf16 te.Linear and te.LayerNormLinear forward and backward match fp32 PyTorch",
)
