"""What the regex time budget (gpuops/agent/wire/signatures/budget.py) costs the scan, and how long a
catastrophic playbook pattern holds it up before it is disabled.

The same synthetic log as bench_scan.py, the same rules: the built-in ones plus the playbook's
(`loss-nan` and bench_scan's 24 extra rules), once as playbook rules (kind `regex`: searched under
the Guard, the interval timer armed while a feed searches one) and once as kind `line` (the same
patterns and trigger literals, searched unguarded). A second pair adds one case-insensitive rule,
which has no trigger literal and is searched in every line: the Guard's worst case.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

from benchkit import Row

from bench_scan import EXTRA_RULES, FX_TRACEBACK, MIB, write_log

from gpuops.agent.wire.signatures.matcher import Matcher, Rule, builtin_rules, regex_rule

CATASTROPHIC = r"(a+)+$"


#: The pairs timed: (what, extra playbook rules from bench_scan, one rule without literals, share of the log).
PAIRS = (("the scan benchmark's rules: built-in + loss-nan", 0, False, 1.0),
         ("built-in + 25 playbook rules", len(EXTRA_RULES), False, 1.0),
         ("built-in + 25 playbook rules + 1 without literals (searched in every line)", len(EXTRA_RULES), True, 0.25))


def rule_sets(extra: int, every_line: bool) -> dict[str, list[Rule]]:
    """{'guarded': playbook rules as kind regex, 'unguarded': the same as kind line}, built-ins first."""
    user = [regex_rule("loss-nan", r"loss (nan|inf)\b")] + [regex_rule(name, p) for name, p in EXTRA_RULES[:extra]]
    if every_line:
        user.append(regex_rule("loss-is-nan", r"(?i)loss is nan"))
    plain = [Rule(r.name, "line", r.action, r.description, r.pattern, triggers=r.triggers) for r in user]
    return {"guarded": builtin_rules() + user, "unguarded": builtin_rules() + plain}


def scan(path: Path, rules: list[Rule], chunk: int = MIB) -> tuple[float, list[tuple[str, int]]]:
    """CPU seconds of one pass of a fresh Matcher over the file (CPU, not wall: the neighbours'
    load on this shared machine moves wall times by 20-30%), and its hits (rule, offset)."""
    matcher = Matcher(rules)
    hits = []
    start = time.process_time()
    with open(path, "rb", buffering=0) as fh:
        while data := fh.read(chunk):
            hits += matcher.feed(data)
    hits += matcher.finish()
    return time.process_time() - start, [(h.rule, h.offset) for h in hits]


def contest(path: Path, sets: dict[str, list[Rule]], runs: int) -> dict[str, float]:
    """Best seconds of each rule set, runs interleaved; their hits must agree."""
    best = {name: float("inf") for name in sets}
    found: dict[str, list] = {}
    for _ in range(runs):
        for name, rules in sets.items():
            secs, hits = scan(path, rules)
            best[name] = min(best[name], secs)
            found[name] = hits
    if len({tuple(h) for h in found.values()}) != 1:
        raise RuntimeError("guarded and unguarded rules found different hits")
    return best


def catastrophic() -> dict[str, Any]:
    """`(a+)+$` on a line of 40 a's then b, an FX race after it: the time until the feed returns."""
    before = b"".join(b"step %d loss 2.0 lr 3e-4\n" % i for i in range(2000))
    after = FX_TRACEBACK.encode() + b"step 2001 loss 2.0\n"
    rules = builtin_rules() + [regex_rule("catastrophic", CATASTROPHIC)]
    timings = {}
    for name, data in (("bad", before + b"a" * 40 + b"b\n" + after), ("clean", before + after)):
        matcher = Matcher(rules)
        start = time.perf_counter()
        hits = matcher.feed(data) + matcher.finish()
        timings[name] = time.perf_counter() - start
        if name == "bad":
            caught = any(h.rule == "fx-tracing-race" for h in hits)
            disabled = matcher.guard.disabled.get("catastrophic")
    return {"bad": timings["bad"], "clean": timings["clean"], "caught": caught, "disabled": disabled}


def bench_guard(args: Any) -> list[Row]:
    """Row 4: guarded vs unguarded scan (MB/s), and the catastrophic rule's cost."""
    fd, name = tempfile.mkstemp(prefix="gpuops-guard-bench-", suffix=".log")
    os.close(fd)
    path = Path(name)
    rows = []
    try:
        for what, extra, every_line, share in PAIRS:
            write_log(path, max(1, int(args.guard_mb * share)))
            size = path.stat().st_size
            best = contest(path, rule_sets(extra, every_line), runs=5)
            rate = {k: size / v / 1e6 for k, v in best.items()}
            rows.append(Row(f"scan, playbook regexes guarded ({what}), {size / MIB:.0f} MiB", [rate["guarded"]],
                            unit="MB/s", baseline_name="the same rules as kind line (unguarded)", note="MB per CPU second, best of 5 interleaved",
                            baseline=[rate["unguarded"]], target="- (the ratio is the budget's cost)"))
    finally:
        path.unlink(missing_ok=True)
    cat = catastrophic()
    rows.append(Row(f"catastrophic rule {CATASTROPHIC} on 'a'*40+'b': time until disabled and the scan goes on",
                    [cat["bad"]], baseline_name="the same log without that line", baseline=[cat["clean"]],
                    target="~ the 1 s budget; the FX race after it still found",
                    met=cat["caught"] and cat["disabled"] is not None and cat["bad"] < 2.0,
                    note=f"rule disabled after {cat['disabled'] or 0:.2f} s of searching; "
                         f"FX race after it {'found' if cat['caught'] else 'MISSED'}"))
    return rows
