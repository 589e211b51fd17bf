"""How long the `slow` tests run: `WP_SLOW_PROFILE=full` (the default: the soak sizes) or `ci`
(a slice of every slow test that runs in 2-3 minutes on a shared 2-core machine, for CI):

    WP_SLOW_PROFILE=ci WP_STRESS_SEEDS=1 .venv/bin/python -m pytest -q -m slow

A test's own variable (WP_CAMPAIGN_S, WP_STRESS_SEEDS) still overrides its size."""

from __future__ import annotations

import os

PROFILES = ("full", "ci")
PROFILE = os.environ.get("WP_SLOW_PROFILE", "full")
if PROFILE not in PROFILES:
    raise ValueError(f"WP_SLOW_PROFILE={PROFILE!r}: must be one of {', '.join(PROFILES)}")


def size(full: int, ci: int) -> int:
    """`full` in the full profile, `ci` in the CI slice."""
    return ci if PROFILE == "ci" else full
