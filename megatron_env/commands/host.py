"""The commands about a node and what happened on it: `profiles`, `kernels`, `collect`,
`check`, `preflight` (many nodes), `triage` (a failed job's logs) and `report` (a bug report's
environment block)."""

from __future__ import annotations

from json import dumps
from pathlib import Path

from megatron_env import findings, output, project, recipes
from megatron_env.commands import cli
from megatron_env.commands.cli import command, json_error
from megatron_env.host import checks, snapshot
from megatron_env.profile import check_default, default_name, load_all
from megatron_env.profile import load as load_profile


@command(markdown="print the README's table of profiles (markdown) instead")
def profiles(markdown: bool = False) -> int:
    """List the profiles under envs/ (* marks the default)."""
    items = load_all()
    default = default_name(items)
    if markdown:
        from megatron_env.commands import profile_table

        output.block(profile_table.markdown(items, default))
        return 0
    output.table([("*" if p.name == default else " ", p.name, f"python {p.python}",
                   f"torch {p.torch}", f"cuda {p.cuda}", f"megatron {p.megatron['tag']}")
                  for p in items])
    output.summary(f"{len(items)} profiles under envs/; * marks the default")
    check_default(items)
    return 0


@command(out="directory to write the snapshot into",
         force="replace a snapshot already in that directory")
def collect(out: str, force: bool = False) -> int:
    """Record this host's GPU, driver, network and limits facts into a snapshot directory."""
    path = Path(out)
    output.status(f"Collecting host facts into {path}")
    snapshot.collect(path, force=force)
    output.summary(f"snapshot written to {path}; analyse it anywhere with "
                   f"`invoke check --snapshot {path}`")
    return 0


@command(snapshot="analyse a snapshot directory instead of this host")
def check(profile: str | None = None, snapshot: str | None = None, json: bool = False) -> int:
    """Check whether this host (or a snapshot) can train the profile's stack at full speed."""
    from megatron_env.host import attention

    with json_error(json, "check"):
        prof = load_profile(profile)
        found = checks.evaluate(prof, Path(snapshot) if snapshot else None)
    source = snapshot or "this host"
    # the attention backends gpu_health timed on this node (its default --out, or the
    # snapshot's gpu_health.json as a preflight keeps it): the fastest is named
    health = (Path(snapshot) / "gpu_health.json" if snapshot
              else project.state_root() / "runs" / "gpu_health" / "results.json")
    if att := attention.from_file(health, prof):
        found.append(att)
    if json:
        findings.emit_json(found, profile=prof.name, source=source)
    else:
        findings.print_findings(found, f"Checked {source} against profile {prof.name}")
    return findings.exit_code(found)


@command(fleet="analyse this directory (one sub-directory per host) instead of running",
         local="run the per-node work on this host only (no Slurm), then analyse it",
         json="print {\"nodes\": [...], \"exclude\": [...]} on stdout",
         profile="profile name (default: the fingerprints' profile, else the default)",
         python="the training interpreter to fingerprint and run gpu_health with",
         run_dir="where the nodes write (default runs/<time>-preflight; shared by nodes)",
         slow="fail a GPU this fraction below its model's fleet median (default 0.1)",
         no_gpu_health="leave the per-GPU GEMM/copy run out",
         size="gpu_health's GEMM edge (default 8192)",
         against="a reference fleet directory to judge these nodes among (--local)",
         nccl="then run verify_nccl through srun across the nodes that did not fail",
         nccl_args="options for verify_nccl.py, e.g. \"--sizes 1M:1G\"")
def preflight(fleet: str | None = None, local: bool = False, json: bool = False,
              profile: str | None = None, python: str | None = None, run_dir: str | None = None,
              slow: str | None = None, no_gpu_health: bool = False, size: int = 8192,
              against: str | None = None, nccl: bool = False, nccl_args: str = "") -> int:
    """Find the bad node before the job does: every node through srun, then the fleet verdict."""
    from megatron_env.fleet import preflight

    with json_error(json, "preflight"):
        v = preflight.run(fleet=fleet, local=local, profile_name=profile, python=python,
                          run_dir=run_dir, slow=slow, health=not no_gpu_health, size=size,
                          against=against)
        rep = v.report
        if json:
            output.block(dumps(rep.to_dict(), indent=2) + "\n")
        else:
            findings.print_fleet(rep.nodes, rep.exclude)
        counts = {s: sum(n.status == s for n in rep.nodes) for s in findings.Status}
        # on stderr: with --json, stdout is the document alone
        output.status(f"preflight: {len(rep.nodes)} node(s) against {v.profile.name}: "
                      + ", ".join(f"{c} {s}" for s, c in counts.items() if c)
                      + (f"; plot {v.plot}" if v.plot else "; no plot (matplotlib missing or "
                         "no GPU results)") + f"; results in {v.root}")
        if rep.exclude:
            output.hint(f"srun/sbatch --exclude={','.join(rep.exclude)}")
        if nccl and v.launched:  # only where this run launched the nodes itself
            code = preflight.nccl_across(v, python, nccl_args)
            if code is not None:
                output.status(f"verify_nccl: {'pass' if code == 0 else 'fail'} across "
                              f"{len(v.healthy())} node(s); results in {v.root / 'nccl'}")
                if code:
                    return 2
        elif nccl:
            output.status("verify_nccl: skipped: --nccl runs inside an allocation, after its "
                          "preflight")
        return rep.exit_code


@command(profile="show this profile's pins only (default: every profile)",
         mirrors="print the table of mirror and local-copy variables (markdown) instead: "
                 "what each stands in for and the pin it must hold")
def kernels(profile: str | None = None, mirrors: bool = False) -> int:
    """List the kernel recipes with each profile's pins and variants."""
    profs = [load_profile(profile)] if profile else load_all()
    if mirrors:
        from megatron_env.commands import mirrors as table

        output.block(table.markdown(profs))
        return 0
    rows = recipes.table(profs)
    output.table(rows)
    output.summary(f"{len(recipes.declared())} kernel recipes; * marks a default variant; "
                   "`invoke build NAME` builds one")
    return 0



@command(rest="logs",
         logs="log files or directories: several words (`megatron-env triage a.log b.log`) or "
              "one comma-separated word (`invoke triage a.log,b.log`); quoted globs work "
              "(\"logs/*.out\"); gzip/xz/zstd logs are read as they are; - reads standard input")
def triage(logs: str | list[str], json: bool = False) -> int:
    """Say why a distributed job failed or hung, from its console logs (one per rank or node)."""
    from megatron_env.diagnose import jobs, render

    skipped: list[str] = []
    words = [logs] if isinstance(logs, str) else logs
    with json_error(json, "triage"):
        found, lines, sources = jobs.run([x for w in words for x in w.split(",") if x], skipped)
    found = render.shown(found, family=not json)  # redacted whole, then cut
    for why in skipped:
        output.warning(f"skipped {why}")
    if json:
        findings.emit_json(found, logs=sources, lines=lines)
    else:
        findings.print_findings(found, f"Triage of {lines} lines from {len(sources)} "
                                       f"log(s), most likely cause first")
    return findings.exit_code(found)


@command(name="report", prefix=f"the environment to report on (default {cli.ENVS}/<profile>)",
         json="print the facts as JSON instead of the block",
         imports="import torch and every compiled module (10-30 s) instead of reading versions "
                 "from the files")
def bug_report(profile: str | None = None, prefix: str | None = None, json: bool = False,
               imports: bool = False) -> int:
    """One block to paste into a bug report: host, GPUs, environment, builds, check, variables."""
    from megatron_env import bug_report as report
    from megatron_env.pyenv import env

    with json_error(json, "report"):
        prof = load_profile(profile)
        output.status(f"Gathering a report for profile {prof.name} ...")
        report.write(report.main(
            prof, Path(prefix).absolute() if prefix else env.default_prefix(prof), json,
            imports=imports))
    return 0

