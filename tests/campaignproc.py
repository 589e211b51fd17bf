"""One worker of the fault campaign and of the two-process race (tests/test_idem_campaign.py).

    python tests/campaignproc.py DATA_DIR TAG KEYS SECONDS SEED [--es N] [--faults]
                                 [--takeover-every S]

Takes the log `campaign` over with an idempotent writer and, until SECONDS have passed, sends
bursts of keys `k-<i>` (i < KEYS, some new, some written before by it or by another worker) with
write_async; payload `TAG:k-<i>`. When fenced by another worker it takes the log over again (and
every `--takeover-every` seconds on its own). With `--faults` a thread breaks things in this
process: LogStore nodes down (one, or all: a storage outage), acks dropped, the metadata store
down; each fault is announced, and counters of calls the faults refused are printed as evidence.

Output lines, each written whole and flushed (times: writer clock ms, then monotonic ns):

    B <s_ms> <s_ns> <k,k,...>                         a burst about to be sent
    A <key> <seg> <entry> <dup> <e_ms> <e_ns>         acknowledged
    F <key> <timed_out> <e_ms> <e_ns> <Error>         failed (may or may not have landed)
    H <key>                                           still pending after close(): a hang
    O <epoch> / X <Error>                             took the log over / a takeover failed
    T <kind> <detail>                                 a fault injected
    E <kind>=<n> ...                                  evidence: calls refused by the faults
    D                                                 done (exit 0)
"""

from __future__ import annotations

import argparse
import concurrent.futures
import faulthandler
import random
import signal
import sys
import threading
import time
from collections import Counter

import woodpecker_idem as wp
from woodpecker_idem.clock import SYSTEM_CLOCK
from woodpecker_idem.errors import (
    NodeUnavailableError,
    StorageUnavailableError,
    WoodpeckerError,
    WriterFencedError,
)
from woodpecker_idem.logstore.transport import FaultInjectingTransport
from woodpecker_idem.retry import Backoff, retry_call

OUT = threading.Lock()


def say(line: str) -> None:
    with OUT:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def now() -> str:
    return f"{SYSTEM_CLOCK.now_ms()} {time.monotonic_ns()}"


class CountingFaults(FaultInjectingTransport):
    """FaultInjectingTransport that counts the calls its faults refused (the evidence)."""

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.refused: Counter[str] = Counter()

    def _count(self, fn, *args):
        try:
            return fn(*args)
        except NodeUnavailableError as exc:
            self.refused["ack_lost" if "lost (injected)" in str(exc) else "node_down"] += 1
            raise

    def add_entries(
        self, node_id, log_id, segment_id, first_entry_id, frame, lac=-1, recovery=False
    ):
        return self._count(
            super().add_entries, node_id, log_id, segment_id, first_entry_id, frame, lac, recovery
        )

    def fence(self, node_id, log_id, segment_id):
        return self._count(super().fence, node_id, log_id, segment_id)

    def read(self, node_id, log_id, segment_id, from_entry_id, max_entries):
        return self._count(super().read, node_id, log_id, segment_id, from_entry_id, max_entries)


class FlakyMeta:
    """The metadata store, down (every call raises StorageUnavailableError) while `down` is set."""

    def __init__(self, inner) -> None:
        self._inner = inner
        self.down = threading.Event()
        self.refused = 0

    def __getattr__(self, name: str):
        attr = getattr(self._inner, name)
        if not callable(attr) or name == "close":
            return attr

        def call(*args, **kwargs):
            if self.down.is_set():
                self.refused += 1
                raise StorageUnavailableError(f"metadata store down (injected) during {name}")
            return attr(*args, **kwargs)

        return call


def inject(faults: CountingFaults, meta: FlakyMeta, rng: random.Random, stop: threading.Event):
    nodes = faults.node_ids
    while not stop.wait(rng.uniform(0.2, 1.0)):
        kind = rng.choice(["node", "node", "acks", "acks", "meta", "storage"])
        if kind == "node":
            node = rng.choice(nodes)
            faults.fail_node(node)
            say(f"T node_down {node}")
            stop.wait(rng.uniform(0.2, 1.5))
            faults.heal_node(node)
        elif kind == "acks":
            node, n = rng.choice(nodes), rng.randint(1, 5)
            faults.drop_acks(node, n)
            say(f"T acks_dropped {node}:{n}")
        elif kind == "meta":
            meta.down.set()
            say("T meta_down")
            stop.wait(rng.uniform(0.2, 1.5))
            meta.down.clear()
        else:
            for node in nodes:
                faults.fail_node(node)
            say("T storage_down all")
            stop.wait(rng.uniform(0.2, 1.5))
            for node in nodes:
                faults.heal_node(node)
        say(
            f"E node_down={faults.refused['node_down']} ack_lost={faults.refused['ack_lost']} "
            f"meta_down={meta.refused}"
        )
    faults.heal_all()
    meta.down.clear()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("data_dir")
    p.add_argument("tag")
    p.add_argument("keys", type=int)
    p.add_argument("seconds", type=float)
    p.add_argument("seed", type=int)
    p.add_argument("--es", type=int, default=1)
    p.add_argument("--faults", action="store_true")
    p.add_argument("--takeover-every", type=float, default=0.0)
    args = p.parse_args()
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the parent asks before a kill
    rng = random.Random(args.seed)
    client = wp.connect(
        args.data_dir,
        {
            "quorum.es": args.es,
            "append.timeout_ms": 1000,
            "append.linger_ms": 2,
            "segment.max_entries": 200,
            "idempotency.snapshot_interval_s": 0.5,
            "idempotency.snapshot_threshold": 100,
        },
    )
    faults = CountingFaults(client.transport)
    client.transport = faults
    meta = FlakyMeta(client.meta)
    client.meta = meta
    stop = threading.Event()
    injector = None
    if args.faults:
        injector = threading.Thread(target=inject, args=(faults, meta, rng, stop), daemon=True)
        injector.start()
    log = retry_call(
        lambda: client.open_log("campaign", create=True),
        lambda e: isinstance(e, StorageUnavailableError),
        Backoff(budget_s=60),
    )
    deadline = time.monotonic() + args.seconds
    writer = None
    opened_at = 0.0
    leftover: list = []  # writers left behind (fenced, or taken over by this process)
    waiting: list = []  # futures that outlived their wait: they must end by close()

    def open_writer():
        w = log.open_writer(idempotent=True, window_duration_s=3600, window_max_keys=1_000_000)
        say(f"O {w.epoch}")
        return w

    while time.monotonic() < deadline:
        if writer is None or (
            args.takeover_every and time.monotonic() - opened_at > args.takeover_every
        ):
            if writer is not None:
                leftover.append(writer)  # not closed: the takeover fences it
            try:
                writer = retry_call(
                    open_writer,
                    lambda e: (
                        isinstance(e, WoodpeckerError) and not isinstance(e, WriterFencedError)
                    ),
                    Backoff(max_s=0.5, budget_s=30),
                )
            except WoodpeckerError as exc:
                say(f"X {type(exc).__name__}")
                writer = None
                time.sleep(0.1)
                continue
            opened_at = time.monotonic()
        names = [f"k-{rng.randrange(args.keys)}" for _ in range(rng.randint(1, 40))]
        say(f"B {now()} {','.join(names)}")
        sent = []
        fenced = False
        for name in names:
            try:
                sent.append(
                    (name, writer.write_async(f"{args.tag}:{name}".encode(), idempotency_id=name))
                )
            except WoodpeckerError as exc:
                fenced |= isinstance(exc, WriterFencedError)
                say(f"F {name} 0 {now()} {type(exc).__name__}")
        concurrent.futures.wait([f for _, f in sent], timeout=20)  # one deadline per burst
        for name, fut in sent:
            try:
                r = fut.result(0)
            except concurrent.futures.TimeoutError:
                say(f"F {name} 1 {now()} TimeoutError")
                waiting.append((name, fut))
                continue
            except WoodpeckerError as exc:
                fenced |= isinstance(exc, WriterFencedError)
                say(f"F {name} {int(isinstance(exc, TimeoutError))} {now()} {type(exc).__name__}")
                continue
            say(
                f"A {name} {r.message_id.segment_id} {r.message_id.entry_id} "
                f"{int(r.duplicate)} {now()}"
            )
        if fenced:
            leftover.append(writer)
            writer = None
    stop.set()
    if injector is not None:
        injector.join()
    for w in [*leftover, writer]:
        if w is not None:
            try:
                w.close(timeout=10)
            except WoodpeckerError:
                pass
    for name, fut in waiting:
        if not fut.done():
            say(f"H {name}")
    say(
        f"E node_down={faults.refused['node_down']} ack_lost={faults.refused['ack_lost']} "
        f"meta_down={meta.refused}"
    )
    client.close()
    say("D")
    return 0


if __name__ == "__main__":
    sys.exit(main())
