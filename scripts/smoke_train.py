#!/usr/bin/env python3
"""smoke_train.py - does a tiny Megatron GPT really train in this environment?

    torchrun --nproc_per_node=1 smoke_train.py [--out runs/smoke_train]
    torchrun --nproc_per_node=4 smoke_train.py --tp 2 --pp 2      # tensor + pipeline parallel
    torchrun --nproc_per_node=2 smoke_train.py                     # data parallel

Builds a small GPT with megatron.core (whatever version is importable: the profile's tag), with
Transformer Engine layers (fp8 off) when TE is usable and Megatron's local layers otherwise, or
as --layer-spec says (transformer_engine: TE or fail, never a fallback), and trains it on
a fixed synthetic batch through Megatron's own forward/backward schedule (pipelined when --pp > 1)
with Adam. The run passes when the loss falls to at most half of its first value. Reports
tokens/s, step time and model FLOPs utilisation; JSON out.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from functools import partial
from pathlib import Path

PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0}  # dense, datasheet


def te_status() -> tuple[bool, str | None]:
    """(usable, error): can Megatron build Transformer Engine layers here? Absent is
    (False, None); installed but not usable is (False, why), which a person must see: it
    silently costs TE's fused kernels.

    `import transformer_engine` alone proves nothing: its __init__ swallows the ImportError of
    the PyTorch part (pydantic missing, a library not found). Megatron imports the PyTorch part
    and silently falls back to a mock when that fails, so both are asked."""
    import importlib.util

    if importlib.util.find_spec("transformer_engine") is None:
        return False, None
    try:
        import transformer_engine.pytorch  # noqa: F401
        from megatron.core.extensions import transformer_engine as mte
    except Exception as e:  # noqa: BLE001 - any failure of an installed TE is reported
        return False, f"{type(e).__name__}: {e}"
    if not getattr(mte, "HAVE_TE", False):
        return False, "megatron.core says HAVE_TE = False"
    return True, None


def layer_spec(choice: str, status: tuple[bool, str | None]):
    """(spec, name, why): Megatron's TE spec or its local one, as --layer-spec asks, given
    te_status().

    auto takes TE when it is usable, local otherwise; transformer_engine fails (no fallback)
    when TE is not usable, so a run that was meant to prove TE cannot pass on local layers."""
    from megatron.core.models.gpt import gpt_layer_specs as specs

    usable, error = status
    if choice != "local" and usable:
        return specs.get_gpt_layer_with_transformer_engine_spec(), "transformer_engine", ""
    why = ("--layer-spec local" if choice == "local"
           else error or "transformer_engine is not installed")
    if choice == "transformer_engine":
        return None, "transformer_engine", why
    return specs.get_gpt_layer_local_spec(), "local", why


def peak_bf16_tflops(gpu: str) -> float | None:
    """The dense bf16 peak of a GPU named like one of PEAK_BF16_TFLOPS (None: unknown GPU)."""
    return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in gpu), None)


def average_gradients(model, dist, group, dp: int) -> None:
    """Plain data parallelism: every parameter's gradient, summed over `group`, over its size."""
    for prm in model.parameters():
        if prm.grad is not None:
            dist.all_reduce(prm.grad, group=group)
            prm.grad /= dp


def report(doc: dict, args, dp: int, world: int, gpu: str, spec_name: str) -> None:
    """Rank 0: the results JSON under --out, and three lines saying what trained how fast."""
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    name = f"results-tp{args.tp}-pp{args.pp}-dp{dp}.json"
    (out_dir / name).write_text(json.dumps(doc, indent=2) + "\n")
    losses, step_s = doc["losses"], doc["step_time_s"]
    print(f"megatron.core {doc['megatron_core']} ({spec_name} layers) on {world}x {gpu}, "
          f"tp={args.tp} pp={args.pp} dp={dp}")
    mfu = "n/a" if doc["mfu"] is None else f"{doc['mfu']:.1%}"
    print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f} in {args.steps} steps; step "
          f"{step_s * 1e3:.1f} ms, {doc['tokens_per_s']:.0f} tokens/s, MFU {mfu}")
    print(f"smoke_train: {doc['status']}; results in {out_dir / name}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--microbatches", type=int, default=2)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--layer-spec", choices=("auto", "transformer_engine", "local"),
                   default="auto", help="Megatron's TE layers (fp8 off), its local ones, or TE "
                                        "when usable (default)")
    p.add_argument("--out", default="runs/smoke_train")
    args = p.parse_args(argv)

    import torch
    import torch.distributed as dist

    try:
        import megatron.core
        from megatron.core import parallel_state as ps
        from megatron.core import tensor_parallel
        from megatron.core.models.gpt import GPTModel
        from megatron.core.pipeline_parallel import get_forward_backward_func
        from megatron.core.transformer.module import Float16Module
        from megatron.core.transformer.transformer_config import TransformerConfig
    except ImportError as e:
        print(json.dumps({"status": "fail", "error": f"megatron.core does not import: {e}",
                          "fix": "run `invoke megatron` (or put Megatron-LM on PYTHONPATH)"}))
        return 1
    if not torch.cuda.is_available():
        print(json.dumps({"status": "fail", "error": "no CUDA GPU", "fix": "run on a GPU node"}))
        return 1

    status = te_status() if args.layer_spec != "local" else (False, None)
    spec, spec_name, spec_why = layer_spec(args.layer_spec, status)
    if spec is None:
        print(json.dumps({"status": "fail", "layer_spec": spec_name,
                          "error": f"--layer-spec transformer_engine: TE not usable: {spec_why}",
                          "fix": "build and install it: invoke build transformer-engine"}))
        return 1

    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29511")
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    if world % (args.tp * args.pp):
        raise SystemExit(f"world size {world} is not a multiple of tp*pp = {args.tp * args.pp}")
    ps.initialize_model_parallel(tensor_model_parallel_size=args.tp,
                                 pipeline_model_parallel_size=args.pp)
    tensor_parallel.model_parallel_cuda_manual_seed(1234)
    dp = ps.get_data_parallel_world_size()

    config = TransformerConfig(
        num_layers=args.layers, hidden_size=args.hidden, num_attention_heads=args.heads,
        tensor_model_parallel_size=args.tp, pipeline_model_parallel_size=args.pp,
        use_cpu_initialization=True, bf16=True, params_dtype=torch.bfloat16,
        pipeline_dtype=torch.bfloat16, hidden_dropout=0.0, attention_dropout=0.0,
    )  # fp8 left unset: TE layers compute in bf16
    te_error = status[1] if spec_name == "local" else None  # installed, not usable: say so
    if te_error and rank == 0:
        print(f"warning: Transformer Engine is installed but does not import ({te_error}); "
              "training with Megatron's local layers. fix: reinstall transformer-engine for "
              "this torch and CUDA", file=sys.stderr)
    model = GPTModel(config=config, transformer_layer_spec=spec, vocab_size=args.vocab,
                     max_sequence_length=args.seq,
                     pre_process=ps.is_pipeline_first_stage(),
                     post_process=ps.is_pipeline_last_stage()).cuda()
    # Megatron trains bf16 through Float16Module: bf16 weights, inputs cast on the first stage,
    # logits/losses back to fp32 on the last.
    model = Float16Module(config, model)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)

    # One fixed synthetic batch per data-parallel rank: a model that learns drives its loss down.
    g = torch.Generator().manual_seed(1000 + ps.get_data_parallel_rank())
    tokens = torch.randint(0, args.vocab, (args.microbatches, args.micro_batch, args.seq + 1),
                           generator=g).cuda()
    position_ids = torch.arange(args.seq, device="cuda").unsqueeze(0).expand(args.micro_batch, -1)

    def loss_func(loss_mask, output_tensor):
        losses = output_tensor.float()
        loss = torch.sum(losses.view(-1) * loss_mask.view(-1)) / loss_mask.sum()
        # clone: the schedule divides the returned loss in place by the number of microbatches
        return loss, {"lm loss": loss.detach().clone()}

    def forward_step(data_iterator, model):
        mb = next(data_iterator)
        inp, labels = mb[:, :-1].contiguous(), mb[:, 1:].contiguous()
        out = model(inp, position_ids, None, labels=labels)
        return out, partial(loss_func, torch.ones_like(labels, dtype=torch.float))

    fwd_bwd = get_forward_backward_func()
    data = itertools.cycle(tokens)  # the same microbatches, step after step
    losses, step_times = [], []
    for _step in range(args.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        out = fwd_bwd(forward_step_func=forward_step, data_iterator=data, model=model,
                      num_microbatches=args.microbatches, seq_length=args.seq,
                      micro_batch_size=args.micro_batch, decoder_seq_length=args.seq,
                      forward_only=False)
        if dp > 1:  # plain data parallelism: average gradients over the data-parallel group
            average_gradients(model, dist, ps.get_data_parallel_group(), dp)
        opt.step()
        torch.cuda.synchronize()
        step_times.append(time.perf_counter() - t0)
        loss = torch.zeros(1, device="cuda")
        if ps.is_pipeline_last_stage() and out:
            loss[0] = sum(float(o["lm loss"]) for o in out) / len(out)
        dist.all_reduce(loss, group=ps.get_pipeline_model_parallel_group())
        dist.all_reduce(loss, group=ps.get_data_parallel_group())
        losses.append(float(loss.item()) / dp)

    steady = step_times[len(step_times) // 2:]
    step_s = sorted(steady)[len(steady) // 2]
    tokens_per_step = args.microbatches * args.micro_batch * args.seq * dp
    n_params = 12 * args.layers * args.hidden**2 + args.vocab * args.hidden
    flops_per_token = 6 * n_params + 12 * args.layers * args.hidden * args.seq
    gpu = torch.cuda.get_device_name()
    peak = peak_bf16_tflops(gpu)
    achieved = flops_per_token * tokens_per_step / step_s / world / 1e12
    passed = losses[-1] <= losses[0] / 2
    doc = {
        "status": "pass" if passed else "fail",
        "megatron_core": getattr(megatron.core, "__version__", "unknown"),
        "megatron_path": str(Path(megatron.core.__file__).parent),
        "layer_spec": spec_name, "layer_spec_asked": args.layer_spec,
        "layer_spec_why": spec_why, "fp8": config.fp8, "torch": torch.__version__, "cuda": torch.version.cuda,
        "gpu": gpu, "world_size": world, "tp": args.tp, "pp": args.pp, "dp": dp,
        "model": {"layers": args.layers, "hidden": args.hidden, "heads": args.heads,
                  "seq": args.seq, "vocab": args.vocab, "params_approx": n_params},
        "steps": args.steps, "loss_first": losses[0], "loss_last": losses[-1], "losses": losses,
        "step_time_s": step_s, "tokens_per_s": tokens_per_step / step_s,
        "model_tflops_per_gpu": achieved,
        "mfu": achieved / peak if peak else None,
    }
    if rank == 0:
        report(doc, args, dp, world, gpu, spec_name)
    ps.destroy_model_parallel()
    dist.destroy_process_group()
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
