"""One worker of the fault campaign and of the two-process race (tests/e2e/test_idem_campaign.py).

    python tests/support/campaignproc.py DATA_DIR TAG KEYS SECONDS SEED [--es N] [--faults]
                                 [--takeover-every S] [--producers N] [--epoch-ns NS]
                                 [--new-keys-per-s R]

Takes the log `campaign` over with an idempotent writer and, until SECONDS have passed, sends
bursts of keys `k-<i>` from `--producers` threads at once, each burst with write_async,
write_many or sync writes; payload `TAG:k-<i>`. The keys: KEYS exist at `--epoch-ns` (a
time.monotonic_ns() every worker shares) and R more every second after it (the frontier), so new
keys keep arriving for the whole run; half of a burst's keys lie just below the frontier (new,
or just written by another worker: a race), the others anywhere below it (mostly duplicates).
The writer's in-flight bounds are small, so the producers wait on backpressure all the time.
When fenced by another worker it takes the log over again (and every `--takeover-every` seconds
on its own). With `--faults` a thread breaks things in this process, each time once new writes
are flowing: LogStore nodes down (one, or all: a storage outage), acks dropped, the metadata
store down; each fault is announced, and
counters of calls the faults refused and of new writes each fault met are printed as evidence.

Output lines, each written whole and flushed (times: writer clock ms, then monotonic ns):

    B <burst> <s_ms> <s_ns> <k,k,...>                 a burst about to be sent
    S <burst>                                         the burst was handed to the writer
    A <burst> <key> <seg> <entry> <dup> <e_ms> <e_ns> acknowledged
    F <burst> <key> <timed_out> <e_ms> <e_ns> <Error> failed (may or may not have landed)
    H <key>                                           still pending after close(): a hang
    O <epoch> / X <Error>                             took the log over / a takeover failed
    T <kind> <detail>                                 a fault injected
    E <kind>=<n> ...                                  evidence: calls refused by the faults
    M <kind>=<n> ...                                  new writes (entries sent to a node for the
                                                      first time) each fault kind met so far
    D                                                 done (exit 0)

A new write *meets* node_down or storage_down when an add carrying it is refused by a node that
is down, acks_dropped when the ack of an add carrying it is dropped, meta_down when an add
carrying it is sent while the metadata store is down, and takeover when a node refuses an add
carrying it because another writer fenced the segment. Recovery copies are not new writes.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import faulthandler
import itertools
import random
import signal
import sys
import threading
import time
from collections import Counter

import woodpecker_idem as wp
from woodpecker_idem._core import count_records
from woodpecker_idem.clock import SYSTEM_CLOCK
from woodpecker_idem.errors import (
    NodeUnavailableError,
    SegmentFencedError,
    StorageUnavailableError,
    WoodpeckerError,
    WriterFencedError,
)
from woodpecker_idem.retry import Backoff, retry_call
from woodpecker_idem.testing import FaultInjectingTransport

OUT = threading.Lock()
MET_KINDS = ("node_down", "storage_down", "acks_dropped", "meta_down", "takeover")


def say(line: str) -> None:
    with OUT:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def now() -> str:
    return f"{SYSTEM_CLOCK.now_ms()} {time.monotonic_ns()}"


class CountingFaults(FaultInjectingTransport):
    """FaultInjectingTransport that counts the calls its faults refused (the evidence) and the
    new writes each kind of fault met (entries, each counted once per kind)."""

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.refused: Counter[str] = Counter()
        self.active: set[str] = set()  # the fault kinds in force now (set by `inject`)
        self.met: dict[str, set[tuple[int, int]]] = {kind: set() for kind in MET_KINDS}
        self._met_lock = threading.Lock()
        self.adds = 0  # adds of new entries sent (not recovery copies): writes are flowing

    def _meet(self, kinds: list[str], segment_id: int, first: int, frame: bytes) -> None:
        entries = {(segment_id, first + i) for i in range(count_records(frame))}
        with self._met_lock:
            for kind in kinds:
                self.met[kind] |= entries

    def met_line(self) -> str:
        with self._met_lock:
            return "M " + " ".join(f"{k}={len(v)}" for k, v in self.met.items())

    def _count(self, fn, *args):
        try:
            return fn(*args)
        except NodeUnavailableError as exc:
            self.refused["ack_lost" if "lost (injected)" in str(exc) else "node_down"] += 1
            raise

    def add_entries(
        self, node_id, log_id, segment_id, first_entry_id, frame, lac=-1, recovery=False
    ):
        args = (node_id, log_id, segment_id, first_entry_id, frame, lac, recovery)
        with self._met_lock:
            active = set(self.active)
            self.adds += not recovery
        meets = [] if recovery else ["meta_down"] if "meta_down" in active else []
        try:
            return self._count(super().add_entries, *args)
        except NodeUnavailableError as exc:
            if not recovery:
                if "lost (injected)" in str(exc):
                    meets.append("acks_dropped")
                else:
                    meets.append("storage_down" if "storage_down" in active else "node_down")
            raise
        except SegmentFencedError:
            if not recovery:
                meets.append("takeover")
            raise
        finally:
            if meets:
                self._meet(meets, segment_id, first_entry_id, frame)

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

    def during(kind: str, seconds: float) -> None:
        with faults._met_lock:
            faults.active.add(kind)
        stop.wait(seconds)
        with faults._met_lock:
            faults.active.discard(kind)

    def writes_flowing(since: int) -> bool:
        """Wait until new writes were sent since `since` adds (False once stopped): a fault
        while none flow (start-up, a takeover) meets none, and the campaign counts on each kind
        meeting some."""
        while faults.adds <= since:
            if stop.wait(0.01):
                return False
        return True

    bag: list[str] = []  # each kind in every six faults (in random order): none goes missing
    while not stop.wait(rng.uniform(0.2, 1.0)) and writes_flowing(faults.adds):
        if not bag:
            bag = ["node", "node", "acks", "acks", "meta", "storage"]
            rng.shuffle(bag)
        kind = bag.pop()
        if kind == "node":
            node = rng.choice(nodes)
            faults.fail_node(node)
            say(f"T node_down {node}")
            during("node_down", rng.uniform(0.2, 1.5))
            faults.heal_node(node)
        elif kind == "acks":
            node, n = rng.choice(nodes), rng.randint(1, 5)
            faults.drop_acks(node, n)
            say(f"T acks_dropped {node}:{n}")
        elif kind == "meta":
            meta.down.set()
            say("T meta_down")
            during("meta_down", rng.uniform(0.2, 1.5))
            meta.down.clear()
        else:
            for node in nodes:
                faults.fail_node(node)
            say("T storage_down all")
            during("storage_down", rng.uniform(0.2, 1.5))
            for node in nodes:
                faults.heal_node(node)
        say(
            f"E node_down={faults.refused['node_down']} ack_lost={faults.refused['ack_lost']} "
            f"meta_down={meta.refused}"
        )
        say(faults.met_line())
    faults.heal_all()
    meta.down.clear()


class Keys:
    """Key names: `initial` exist at `epoch_ns`, `per_s` more every second after it."""

    def __init__(self, initial: int, epoch_ns: int, per_s: float) -> None:
        self.initial, self.epoch_ns, self.per_s = initial, epoch_ns, per_s

    def frontier(self) -> int:
        elapsed = max(0.0, (time.monotonic_ns() - self.epoch_ns) / 1e9)
        return self.initial + int(elapsed * self.per_s)

    def burst(self, rng: random.Random) -> list[str]:
        top = self.frontier()
        names = []
        for _ in range(rng.randint(1, 40)):
            if rng.random() < 0.5:
                i = top - 1 - rng.randrange(min(top, 64))  # new, or a race with another worker
            else:
                i = rng.randrange(top)
            names.append(f"k-{i}")
        return names


class Producer(threading.Thread):
    """Sends bursts until the deadline on whichever writer the worker has open."""

    def __init__(self, worker: Worker, n: int, seed: int) -> None:
        super().__init__(name=f"producer-{n}", daemon=True)
        self.worker, self.n, self.rng = worker, n, random.Random(seed)
        self.bursts = itertools.count()

    def run(self) -> None:
        w = self.worker
        while time.monotonic() < w.deadline:
            writer = w.current()
            if writer is None:
                time.sleep(0.01)
                continue
            burst = f"{self.n}.{next(self.bursts)}"
            mode = self.rng.choice(["async", "async", "many", "sync"])
            names = w.keys.burst(self.rng)[: 5 if mode == "sync" else None]
            payloads = [f"{w.tag}:{name}".encode() for name in names]
            say(f"B {burst} {now()} {','.join(names)}")
            if mode == "async":
                fenced = self.send_async(writer, burst, names, payloads)
            elif mode == "many":
                fenced = self.send_many(writer, burst, names, payloads)
            else:
                fenced = self.send_sync(writer, burst, names, payloads)
            if fenced:
                w.fenced(writer)

    def send_async(self, writer, burst: str, names: list[str], payloads: list[bytes]) -> bool:
        sent = []
        fenced = False
        for name, payload in zip(names, payloads, strict=True):
            try:
                sent.append((name, writer.write_async(payload, idempotency_id=name)))
            except WoodpeckerError as exc:
                fenced |= isinstance(exc, WriterFencedError)
                timed_out = int(isinstance(exc, TimeoutError))
                say(f"F {burst} {name} {timed_out} {now()} {type(exc).__name__}")
        say(f"S {burst}")
        concurrent.futures.wait([f for _, f in sent], timeout=20)  # one deadline per burst
        for name, fut in sent:
            try:
                r = fut.result(0)
            except concurrent.futures.TimeoutError:
                say(f"F {burst} {name} 1 {now()} TimeoutError")
                self.worker.waiting.append((name, fut))
                continue
            except WoodpeckerError as exc:
                fenced |= isinstance(exc, WriterFencedError)
                timed_out = int(isinstance(exc, TimeoutError))
                say(f"F {burst} {name} {timed_out} {now()} {type(exc).__name__}")
                continue
            self.ack(burst, name, r.message_id, r.duplicate)
        return fenced

    def send_many(self, writer, burst: str, names: list[str], payloads: list[bytes]) -> bool:
        try:
            res = writer.write_many(payloads, names, timeout=20)
        except WoodpeckerError as exc:
            say(f"S {burst}")
            timed_out = int(isinstance(exc, TimeoutError))
            acked = getattr(exc, "acknowledged", None)
            batch = getattr(exc, "batch_result", None)
            for i, name in enumerate(names):
                if acked is not None and batch is not None and acked[i]:
                    self.ack(burst, name, batch.message_id(i), bool(batch.duplicate[i]))
                else:
                    say(f"F {burst} {name} {timed_out} {now()} {type(exc).__name__}")
            return isinstance(exc, WriterFencedError)
        say(f"S {burst}")
        for i, name in enumerate(names):
            self.ack(burst, name, res.message_id(i), bool(res.duplicate[i]))
        return False

    def send_sync(self, writer, burst: str, names: list[str], payloads: list[bytes]) -> bool:
        fenced = False
        for name, payload in zip(names, payloads, strict=True):
            try:
                r = writer.write(payload, idempotency_id=name, timeout=20)
            except WoodpeckerError as exc:
                fenced |= isinstance(exc, WriterFencedError)
                timed_out = int(isinstance(exc, TimeoutError))
                say(f"F {burst} {name} {timed_out} {now()} {type(exc).__name__}")
                continue
            self.ack(burst, name, r.message_id, r.duplicate)
        say(f"S {burst}")
        return fenced

    @staticmethod
    def ack(burst: str, name: str, mid, dup) -> None:
        say(f"A {burst} {name} {mid.segment_id} {mid.entry_id} {int(dup)} {now()}")


class Worker:
    """The writer the producers share, taken over when fenced or every `takeover_every` s."""

    def __init__(self, log, tag: str, keys: Keys, deadline: float, takeover_every: float):
        self.log, self.tag, self.keys, self.deadline = log, tag, keys, deadline
        self.takeover_every = takeover_every
        self.lock = threading.Lock()
        self.writer = None
        self.opened_at = 0.0
        self.stale = threading.Event()  # the writer was fenced: take the log over again
        self.leftover: list = []  # writers left behind (fenced, or taken over by this process)
        self.waiting: list = []  # futures that outlived their wait: they must end by close()

    def current(self):
        with self.lock:
            return self.writer

    def fenced(self, writer) -> None:
        with self.lock:
            if writer is self.writer:
                self.writer = None
                self.leftover.append(writer)
                self.stale.set()

    def open_writer(self):
        w = self.log.open_writer(idempotent=True, window_duration_s=3600, window_max_keys=1_000_000)
        say(f"O {w.epoch}")
        return w

    def run(self) -> None:
        """Keep a writer open until the deadline (the producers write on it)."""
        while time.monotonic() < self.deadline:
            due = self.takeover_every and time.monotonic() - self.opened_at > self.takeover_every
            if self.current() is not None and not due:
                self.stale.wait(0.05)
                continue
            try:
                w = retry_call(
                    self.open_writer,
                    lambda e: (
                        isinstance(e, WoodpeckerError) and not isinstance(e, WriterFencedError)
                    ),
                    Backoff(max_s=0.5, budget_s=30),
                )
            except WoodpeckerError as exc:
                say(f"X {type(exc).__name__}")
                time.sleep(0.1)
                continue
            with self.lock:
                if self.writer is not None:
                    self.leftover.append(self.writer)  # not closed: the takeover fences it
                self.writer = w
                self.stale.clear()
            self.opened_at = time.monotonic()


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
    p.add_argument("--producers", type=int, default=1)
    p.add_argument("--epoch-ns", type=int, default=0)
    p.add_argument("--new-keys-per-s", type=float, default=0.0)
    args = p.parse_args()
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the parent asks before a kill
    rng = random.Random(args.seed)
    client = wp.connect(
        args.data_dir,
        {
            "quorum.es": args.es,
            "append.timeout_ms": 1000,
            "append.linger_ms": 2,
            # small bounds: producers wait for room and batches stay small all the time
            "append.max_inflight_entries": 48,
            "append.max_batch_entries": 8,
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
    epoch_ns = args.epoch_ns or time.monotonic_ns()
    keys = Keys(args.keys, epoch_ns, args.new_keys_per_s)
    worker = Worker(log, args.tag, keys, time.monotonic() + args.seconds, args.takeover_every)
    producers = [Producer(worker, n, rng.randrange(2**31)) for n in range(args.producers)]
    for t in producers:
        t.start()
    worker.run()
    for t in producers:
        t.join()
    stop.set()
    if injector is not None:
        injector.join()
    for w in [*worker.leftover, worker.writer]:
        if w is not None:
            try:
                w.close(timeout=10)
            except WoodpeckerError:
                pass
    for name, fut in worker.waiting:
        if not fut.done():
            say(f"H {name}")
    say(
        f"E node_down={faults.refused['node_down']} ack_lost={faults.refused['ack_lost']} "
        f"meta_down={meta.refused}"
    )
    say(faults.met_line())
    client.close()
    say("D")
    return 0


if __name__ == "__main__":
    sys.exit(main())
