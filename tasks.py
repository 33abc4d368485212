"""invoke tasks: argument parsing only; the work happens in megatron_env.commands."""

from invoke import Exit, task

from megatron_env import commands

# setup, env and build take a bundle the same way
BUNDLE_HELP = "use only this bundle (.tar or unpacked directory; repeat for deltas)"


def _done(code: int) -> None:
    if code:
        raise Exit(code=code)


@task
def profiles(c):
    """List the profiles under envs/ (* marks the default)."""
    _done(commands.profiles())


@task(help={"out": "directory to write the snapshot into",
            "force": "replace a snapshot already in that directory"})
def collect(c, out, force=False):
    """Record this host's GPU, driver, network and limits facts into a snapshot directory."""
    _done(commands.collect(out, force))


@task(help={"profile": "profile name (default: the default profile)",
            "snapshot": "analyse a snapshot directory instead of this host",
            "json": "print {\"findings\": [...]} on stdout instead of a table"})
def check(c, profile=None, snapshot=None, json=False):
    """Check whether this host (or a snapshot) can train the profile's stack at full speed."""
    _done(commands.check(profile, snapshot, json))


@task(help={"profile": "profile name (default: the default profile)",
            "prefix": "where the environment lives (default .megatron-env/<profile>)",
            "dry_run": "print the plan: what would run and why",
            "only": "run this one step", "from": "start at this step",
            "adopt": "use this existing interpreter (an NGC container's python) as the env",
            "no_builds": "leave the kernel builds out",
            "verify_deep": "re-hash every installed file against its RECORD and import again",
            "bundle": BUNDLE_HELP},
      iterable=["bundle"])
def setup(c, profile=None, prefix=None, dry_run=False, only=None, from_=None, adopt=None,
          no_builds=False, verify_deep=False, bundle=None):
    """check -> lock -> env -> sources -> patches -> builds -> megatron -> verify."""
    _done(commands.setup(profile, prefix, dry_run, only, from_, adopt, no_builds, verify_deep,
                         bundle))


@task(help={"profile": "profile name (default: the default profile)",
            "prefix": "the environment to install into (default .megatron-env/<profile>)"})
def megatron(c, profile=None, prefix=None):
    """Check out Megatron-LM at the profile's tag (pinned commit), patch it, install it."""
    _done(commands.setup(profile, prefix, only="megatron"))


@task(help={"profile": "profile name (default: the default profile; with --check: all)",
            "check": "exit 1 naming every lock that no longer matches its inputs or its seal "
                     "(a pin or hash edited by hand); no network",
            "resolve": "with --check: resolve again (network) and fail on any difference",
            "upgrade_package": "move this one pin to its newest allowed version (repeatable)",
            "python": "interpreter of the profile's Python version to resolve with",
            "conda": "conda/mamba/micromamba executable for conda-lock",
            "channel": "conda channel or mirror overriding the profile's (repeatable)",
            "pypi_to_conda_lookup_file": "local name-mapping file for conda-lock's pip section"},
      iterable=["upgrade_package", "channel"])
def lock(c, profile=None, check=False, upgrade_package=None, python=None, conda=None,
         channel=None, pypi_to_conda_lookup_file=None, resolve=False):
    """Resolve a profile into hashed locks (requirements.lock, environment.yml, conda-lock.yml)."""
    _done(commands.lock(profile, check, upgrade_package, python, conda, channel,
                        pypi_to_conda_lookup_file, resolve))


@task(name="lock-diff",
      help={"base": "git revision to compare with (default: merge base with main)"})
def lock_diff(c, base=None):
    """Markdown table of package changes between the locks at BASE and the working tree."""
    _done(commands.lock_diff(base))


@task(help={"profile": "profile name (default: the default profile)",
            "prefix": "where the environment lives (default .megatron-env/<profile>)",
            "python": "interpreter of the profile's Python for the venv (default: found)",
            "adopt": "check an existing environment (--python, or this interpreter) instead",
            "install_missing": "with --adopt: install what the lock has and it lacks",
            "conda": "conda/mamba/micromamba executable for the conda path",
            "use_conda": "force the conda path (--no-use-conda forces uv)",
            "find_links": "a wheelhouse directory to install from (repeatable)",
            "no_index": "install only from --find-links",
            "verify_deep": "re-hash every installed file against its RECORD and import again",
            "bundle": BUNDLE_HELP},
      iterable=["find_links", "bundle"])
def env(c, profile=None, prefix=None, python=None, adopt=False, install_missing=False,
        conda=None, use_conda=None, find_links=None, no_index=False, verify_deep=False,
        bundle=None):
    """Build the profile's environment from its locks and verify it (seconds when unchanged)."""
    _done(commands.env(profile, prefix, python, adopt, install_missing, conda, use_conda,
                       find_links, no_index, verify_deep, bundle))


@task(help={"what": "a kernel recipe (`invoke kernels` lists them) or all the profile pins",
            "profile": "profile name (default: the default profile)",
            "prefix": "the environment to build for (default .megatron-env/<profile>)",
            "python": "build for this interpreter instead (an adopted environment)",
            "arch": "compute capabilities, e.g. 9.0 or 8.0,9.0, or native (default: profile)",
            "dry_run": "print the build plan (sources, patches, flags, cache key) and stop",
            "cache_dir": "wheel cache shared by the nodes (default .cache, or MEGATRON_ENV_CACHE)",
            "bundle": BUNDLE_HELP},
      iterable=["bundle"])
def build(c, what, profile=None, prefix=None, python=None, arch=None, dry_run=False,
          cache_dir=None, bundle=None):
    """Build a kernel recipe from pinned, patched sources; cache by content; install; verify."""
    _done(commands.build(what, profile, prefix, arch, dry_run, cache_dir, python, bundle))


@task(name="build-check", help={"profile": "profile name (default: the default profile)",
                                "python": "check this interpreter instead of the profile's env"})
def build_check(c, profile=None, python=None):
    """Do the compiled modules of the profile's kernels import in the environment?"""
    _done(commands.build_check(profile, python))


@task(help={"profile": "show this profile's pins only (default: every profile)"})
def kernels(c, profile=None):
    """List the kernel recipes with each profile's pins and variants."""
    _done(commands.kernels(profile))


@task(help={"logs": "log files or directories, comma-separated; quoted globs work "
                   "(\"logs/*.out\")",
            "json": "print {\"findings\": [...]} on stdout instead of a table"})
def triage(c, logs, json=False):
    """Say why a distributed job failed or hung, from its console logs (one per rank or node)."""
    _done(commands.triage([x for x in logs.split(",") if x], json))


@task(name="report", help={"profile": "profile name (default: the default profile)",
                           "prefix": "the environment to report on "
                                     "(default .megatron-env/<profile>)",
                           "json": "print the facts as JSON instead of the block",
                           "imports": "import torch and every compiled module (10-30 s) "
                                      "instead of reading versions from the files"})
def bug_report(c, profile=None, prefix=None, json=False, imports=False):
    """One block to paste into a bug report: host, GPUs, environment, builds, check, variables."""
    _done(commands.bug_report(profile, prefix, json, imports))


@task(help={"fleet": "analyse this directory (one sub-directory per host) instead of running",
            "local": "run the per-node work on this host only (no Slurm), then analyse it",
            "json": "print {\"nodes\": [...], \"exclude\": [...]} on stdout",
            "profile": "profile name (default: the fingerprints' profile, else the default)",
            "python": "the training interpreter to fingerprint and run gpu_health with",
            "run_dir": "where the nodes write (default runs/<time>-preflight; shared by nodes)",
            "slow": "fail a GPU this fraction below its model's fleet median (default 0.1)",
            "no_gpu_health": "leave the per-GPU GEMM/copy run out",
            "size": "gpu_health's GEMM edge (default 8192)",
            "against": "a reference fleet directory to judge these nodes among (--local)",
            "nccl": "then run verify_nccl through srun across the nodes that did not fail",
            "nccl_args": "options for verify_nccl.py, e.g. \"--sizes 1M:1G\""})
def preflight(c, fleet=None, local=False, json=False, profile=None, python=None, run_dir=None,
              slow=None, no_gpu_health=False, size=8192, against=None, nccl=False,
              nccl_args=""):
    """Find the bad node before the job does: every node through srun, then the fleet verdict."""
    _done(commands.preflight(fleet, local, json, profile, python, run_dir, slow,
                             not no_gpu_health, size, against, nccl, nccl_args))


@task(help={"profile": "profile name (default: the default profile)",
            "out": "the archive to write (FILE.tar)",
            "adopt": "leave the lock's wheels out: for nodes that adopt their own torch",
            "with_builds": "add the cached kernel wheels built for this profile",
            "since": "write only what this older bundle lacks (a delta)",
            "without": "leave this kernel package out (repeat; its builds then need a bundle "
                       "that has it)"},
      iterable=["without"])
def bundle(c, out, profile=None, adopt=False, with_builds=False, since=None, without=None):
    """One archive with everything `invoke setup --bundle` needs on a node without network."""
    _done(commands.bundle(profile, out, adopt, with_builds, since, without))
