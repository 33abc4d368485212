"""`python -m megatron_env`: the same front door as the `megatron-env` command."""

from megatron_env.commands.main import main

raise SystemExit(main())
