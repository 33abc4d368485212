"""`python -m megatron_env`: the same front door as the `megatron-env` command."""

from megatron_env.main import main

raise SystemExit(main())
