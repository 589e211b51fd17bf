"""Placement: which nodes hold a new segment (BookKeeper's `EnsemblePlacementPolicy.newEnsemble`).

Rotated by segment id over the live nodes, so segments spread over the nodes; a node named in
`exclude` (one that failed in the writer's previous segment) is left out while enough others are
live, and taken last otherwise: a segment on a node that may be back beats no segment at all.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from ..errors import QuorumUnavailableError


def new_ensemble(
    live: Sequence[str], es: int, segment_id: int, exclude: Collection[str] = ()
) -> tuple[str, ...]:
    """`es` nodes of `live` (sorted node ids) for segment `segment_id`, avoiding `exclude`."""
    if len(live) < es:
        known = ", ".join(live) or "none"
        raise QuorumUnavailableError(
            f"{len(live)} LogStore node(s) live ({known}); a segment needs es={es}"
        )
    start = segment_id % len(live)
    ring = list(live[start:]) + list(live[:start])
    preferred = [n for n in ring if n not in exclude]
    rest = [n for n in ring if n in exclude]
    return tuple((preferred + rest)[:es])
