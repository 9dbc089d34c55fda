"""What the nodes of one torchrun job tell each other, through torchrun's own rendezvous store.

One key per attempt holds the job's end: the first node that ends (a rule, a stall, a failure, a
stop) sets it with compare-and-set, so every node reads the same first failing node. The value is
signed with the run's key (watch.json `job.key`, mode 0600 on each node, never shown): a process
that can reach the store but does not hold the key cannot end the job. Also the line format between
a node's watchdog and its link process (agent/run/jobstore.py): one JSON object a line each way.
"""

from __future__ import annotations

import json
from typing import Any, Dict, Optional

PREFIX = "gpuops/job/"


def store_key(rdzv_id: str) -> str:
    """The key of this attempt's end (the rendezvous id names the attempt: <run>, <run>-a2, ...)."""
    return PREFIX + rdzv_id + "/end"


def rdzv_id(run_id: str, attempt: int) -> str:
    """torchrun's --rdzv-id for attempt n: a fresh rendezvous per attempt."""
    return run_id if attempt <= 1 else "%s-a%d" % (run_id, attempt)


def _mac(key: str, body: str) -> str:
    import hashlib  # here, not at the top: a watchdog of a run that is no job never loads OpenSSL
    import hmac

    return hmac.new(key.encode(), body.encode(), hashlib.sha256).hexdigest()


def sign(key: str, record: Dict[str, Any]) -> str:
    body = json.dumps(record, sort_keys=True, separators=(",", ":"))
    return json.dumps({"body": body, "mac": _mac(key, body)}, sort_keys=True)


def verify(key: str, text: str) -> Optional[Dict[str, Any]]:
    """The record if its signature is the run key's, else None."""
    try:
        outer = json.loads(text)
        body, mac = outer["body"], outer["mac"]
        import hmac

        if not hmac.compare_digest(_mac(key, body), str(mac)):
            return None
        record = json.loads(body)
    except (ValueError, KeyError, TypeError):
        return None
    return record if isinstance(record, dict) else None


def line(kind: str, **data: Any) -> bytes:
    """One message between the watchdog and its link: connected, end, lost, publish."""
    return (json.dumps({"kind": kind, **data}, sort_keys=True) + "\n").encode()


def parse(raw: bytes) -> Optional[Dict[str, Any]]:
    try:
        msg = json.loads(raw.decode("utf-8", "replace"))
    except ValueError:
        return None
    return msg if isinstance(msg, dict) and "kind" in msg else None
