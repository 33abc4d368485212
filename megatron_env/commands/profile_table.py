"""The README's table of profiles, made from the profiles themselves: Python, torch, CUDA, the
minimum driver, Megatron's tag and commit, and every kernel each pins (before: written by hand,
it listed two kernels for a profile that pins three). `megatron-env profiles --markdown` prints
it; README.md holds it between markers and a test keeps the two equal."""

from __future__ import annotations

from megatron_env.profile import Profile

BEGIN, END = "<!-- profiles:begin (megatron-env profiles --markdown) -->", "<!-- profiles:end -->"


def _pin(pins: dict[str, object]) -> str:
    """A kernel's pin as a person names it: its version, else its tag, else its commit."""
    return str(pins.get("version") or pins.get("tag") or str(pins.get("commit", ""))[:8])


def markdown(profiles: list[Profile], default: str | None) -> str:
    """The table as README.md holds it (without the markers), the default profile first."""
    lines = ["| profile | Python | torch | CUDA | driver | Megatron | kernels |",
             "|---|---|---|---|---|---|---|"]
    for p in sorted(profiles, key=lambda p: p.name != default):  # the default first
        name = f"`{p.name}`" + (" (default)" if p.name == default else "")
        megatron = f"{p.megatron['tag']} @ {p.megatron['commit'][:8]}"
        kernels = ", ".join(f"{k} {_pin(v)}" for k, v in p.kernels.items())
        lines.append(f"| {name} | {p.python} | {p.torch} | {p.cuda} | >= {p.min_driver} | "
                     f"{megatron} | {kernels} |")
    return "\n".join(lines) + "\n"
