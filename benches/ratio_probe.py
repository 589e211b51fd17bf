"""Long-run probe of the idempotent/plain throughput ratio: the bench's `WriteRun` bursts, plain,
business id and content key interleaved for SECONDS, then the median per-round ratio over the
whole run and per block of 61 rounds (one `bench_idem.py` run's worth). The blocks show how far
one bench run can land from the long-run figure on this shared machine.

    .venv/bin/python benches/ratio_probe.py 240
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time

from bench_idem import KINDS, ROUNDS, WriteRun

import woodpecker_idem as wp


def main(seconds: float) -> None:
    results: dict[str, list[float]] = {k: [] for k in KINDS}
    with tempfile.TemporaryDirectory() as tmp:
        client = wp.connect(tmp, {"quorum.es": 1})
        for kind in KINDS:
            WriteRun(client, kind, f"warm-{kind}").run()
        end = time.monotonic() + seconds
        r = 0
        while time.monotonic() < end:
            for kind in KINDS if r % 2 == 0 else KINDS[::-1]:
                results[kind].append(WriteRun(client, kind, f"{kind}-{r}").run()[0])
            r += 1
        client.close()
    plain = results["plain"]
    medians = {k: round(statistics.median(v)) for k, v in results.items()}
    print(f"rounds {r}; median writes/s {medians}")
    for kind in ("explicit", "content"):
        ratios = [x / p for x, p in zip(results[kind], plain, strict=True)]
        blocks = [
            round(statistics.median(ratios[i : i + ROUNDS]), 3)
            for i in range(0, len(ratios) - ROUNDS + 1, ROUNDS)
        ]
        median = statistics.median(ratios)
        print(f"{kind}: median ratio {median:.3f}; per {ROUNDS}-round block {blocks}")


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 240.0)
