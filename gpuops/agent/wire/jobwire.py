"""What the nodes of one torchrun job tell each other, through torchrun's own rendezvous store.

Each attempt's end is a row of slots, `gpuops/job/<rdzv id>/end`, then `.../end/2`, `.../end/3`, ...,
each written once: a node that ends (a rule, a stall, a failure, a stop) puts its end record into
the first free slot with compare-and-set, so every node reads the same slots in the same order and
the first one that verifies names the same first failing node everywhere. A record is signed with
the run's key (watch.json `job.key`, mode 0600 on each node, never shown) and names the run, the
attempt's rendezvous id and the node: a process that reaches the store but does not hold the key
cannot end the job, cannot block the real end by writing a slot first (the slot is skipped, the
end goes into the next), and cannot replay one attempt's end into another's. Also the line format
between a node's watchdog and its link process (agent/run/jobstore.py): one JSON object a line
each way.
"""

from __future__ import annotations

import json
from typing import Any, Dict, NamedTuple, Optional, Sequence, Tuple

PREFIX = "gpuops/job/"
#: How long a store that went away before the job's end may take to answer again before the job counts as
#: ended on this node (docs/torchrun.md says why this is safe across a restart's new store).
STORE_GRACE = 10.0
#: abort.json `first_by` of a node ended because node 0's store went for good before anyone set the job's end.
STORE_GONE = "store-gone"
#: How long the first node waits for every other node to have read its end before it stops its torchrun
#: (maybe the store's host: the store goes with it).
SETTLE = 1.0


class Attempt(NamedTuple):
    """What an end record must be bound to: the job's run id, this attempt's rendezvous id, the job's nodes."""

    run: str
    rdzv: str
    nodes: Sequence[str]


def store_key(rdzv_id: str, slot: int = 1) -> str:
    """The key of slot n of this attempt's end (the rendezvous id names the attempt: <run>, <run>-a2, ...)."""
    return PREFIX + rdzv_id + "/end" + ("" if slot <= 1 else "/%d" % slot)


def mark_key(rdzv_id: str, rank: int) -> str:
    """Where a node's link leaves its mark in this attempt's store: found again after a dropped connection,
    it says the store is the same one (a store started again, by node 0's next attempt, is empty)."""
    return "%s%s/link/%d" % (PREFIX, rdzv_id, rank)


def read_key(rdzv_id: str, rank: int) -> str:
    """Set by a node's link once it has read the job's end: the first node waits for the others' (SETTLE)."""
    return "%s%s/read/%d" % (PREFIX, rdzv_id, rank)


def summary_key(rdzv_id: str, rank: int) -> str:
    """Where a node puts its summary before a stalled job's abort (its ranks, where they were, their Flight
    Recorders), signed as an end is: every node reads every node's to the same verdict (wire/hang.py)."""
    return "%s%s/hang/%d" % (PREFIX, rdzv_id, rank)


def figure_key(rdzv_id: str, rank: int) -> str:
    """Where a node keeps its latest throughput figure, signed, for the other nodes' slow-node detector."""
    return "%s%s/figure/%d" % (PREFIX, rdzv_id, rank)


#: Seconds a node waits for the other nodes' summaries before its stalled abort's signal (they take their stacks
#: and recorders first: 4 s each at most, then a second to write): the store lives until node 0 has waited.
GATHER_WAIT = 15.0


def rdzv_id(run_id: str, attempt: int) -> str:
    """torchrun's --rdzv-id for attempt n: a fresh rendezvous per attempt."""
    return run_id if attempt <= 1 else "%s-a%d" % (run_id, attempt)


def attempt_of(at: Attempt) -> int:
    """The attempt number this attempt's rendezvous id names (<run>: 1, <run>-aN: N)."""
    tail = at.rdzv[len(at.run):] if at.rdzv.startswith(at.run) else ""
    return int(tail[2:]) if tail.startswith("-a") and tail[2:].isdigit() else 1


def _mac(key: str, body: str) -> str:
    import hashlib  # here, not at the top: a watchdog of a run that is no job never loads OpenSSL
    import hmac

    return hmac.new(key.encode(), body.encode(), hashlib.sha256).hexdigest()


def sign(key: str, record: Dict[str, Any]) -> str:
    body = json.dumps(record, sort_keys=True, separators=(",", ":"))
    return json.dumps({"body": body, "mac": _mac(key, body)}, sort_keys=True)


def verify(key: str, text: str) -> Optional[Dict[str, Any]]:
    """The record if its signature is the run key's, else None (what it is bound to is check's)."""
    try:
        outer = json.loads(text)
        body, mac = outer["body"], outer["mac"]
        import hmac

        if not hmac.compare_digest(_mac(key, str(body)), str(mac)):
            return None
        record = json.loads(body)
    except (ValueError, KeyError, TypeError):
        return None
    return record if isinstance(record, dict) else None


def seal(key: str, record: Dict[str, Any], at: Attempt) -> str:
    """What a node writes into a slot: its end record bound to the run and the attempt, signed."""
    return sign(key, {**record, "run": at.run, "rdzv": at.rdzv})


def check(key: str, text: str, at: Attempt) -> Tuple[Optional[Dict[str, Any]], Optional[str]]:
    """(the record, None) when `text` is this attempt's end signed with the run's key; else (None, why not)."""
    record = verify(key, text)
    if record is None:
        return None, "not signed with this run's key"
    if record.get("run") != at.run or record.get("rdzv") != at.rdzv:
        return None, "an end signed for another attempt or run (%s), replayed" % str(record.get("rdzv"))[:80]
    attempt, rank = record.get("attempt"), record.get("node_rank")
    if not isinstance(attempt, int) or rdzv_id(at.run, attempt) != at.rdzv:
        return None, "an end signed for attempt %s, not this one's rendezvous" % str(attempt)[:20]
    if not isinstance(rank, int) or not 0 <= rank < len(at.nodes) or at.nodes[rank] != record.get("node"):
        return None, "an end naming no node of the job"
    return record, None


def line(kind: str, **data: Any) -> bytes:
    """One message between the watchdog and its link: connected, end, settled, forged, lost, gone, publish; summary
    and gathered (a stalled job's node summaries), figure and figures (the nodes' throughput)."""
    return (json.dumps({"kind": kind, **data}, sort_keys=True) + "\n").encode()


def parse(raw: bytes) -> Optional[Dict[str, Any]]:
    try:
        msg = json.loads(raw.decode("utf-8", "replace"))
    except ValueError:
        return None
    return msg if isinstance(msg, dict) and "kind" in msg else None
