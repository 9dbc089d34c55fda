"""The signature matcher on real failure texts: samples, chunking, bounds, the fast path."""

from __future__ import annotations

import random
import re
import tracemalloc
from pathlib import Path

import pytest

from gpuops.agent.wire.signatures import matcher as matcher_mod
from gpuops.agent.wire.signatures import scan as scan_mod
from gpuops.agent.wire.signatures.matcher import Hit, Matcher, Rule, builtin_rules, regex_rule
from gpuops.client.view import accel

LOGS = Path(__file__).parent.parent / "data" / "logs"
FX = "RuntimeError: Detected that you are using FX to symbolically trace a dynamo-optimized function. This is not supported at the moment."
LOSS_NAN = regex_rule("loss-nan", r"loss (nan|inf)\b")

# sample -> expected (rule, line number) of every hit
EXPECTED = {
    "fx_race_thread.txt": [("fx-tracing-race", 12)],
    "fx_race_interleaved.txt": [("fx-tracing-race", 36), ("fx-tracing-race", 37), ("fx-tracing-race", 38)],
    "fx_race_caught.txt": [("fx-tracing-race", 10)],
    "fx_race_tqdm.txt": [("fx-tracing-race", 17)],
    "fx_race_rank_prefix.txt": [("fx-tracing-race", 10)],
    # The real race on an H200 (tests/data/real_h200/fx-race.log) without its two whole
    # exception lines: only the one torn in two by another thread's output is left.
    "fx_race_all_torn.txt": [("fx-tracing-race", 38)],
    "oom.txt": [("cuda-oom", 17)],
    "device_assert.txt": [("cuda-error", 19)],
    "illegal_memory_access.txt": [("cuda-error", 7)],
    "nccl_watchdog.txt": [("nccl-watchdog-timeout", 2)],
    "nccl_error.txt": [("nccl-error", 12)],
    "backend_compiler_failed.txt": [("compile-failed", 12)],
    "inductor_error.txt": [("compile-failed", 8)],
    "segfault_fatal_python.txt": [("segfault", 2)],
    "segfault_bash.txt": [("segfault", 3)],
    "faulthandler_timeout.txt": [("faulthandler-timeout", 2)],
    "recompile_limit.txt": [("recompile-limit", 2)],
    # torch 2.11's eager fallback on an H200 (REFERENCE.md): the unfused warning, then a thread dies.
    "fx_patcher_race.txt": [("flex-attention-unfused", 2), ("fx-patcher-race", 24)],
    "mentions.txt": [],
    "clean_training.txt": [],
}


class LineByLine(Matcher):
    """The reference: every line goes through the per-line matcher, no prefilter."""

    def _busy(self) -> bool:
        return True


def regex_prefilter(sets):
    """A second implementation of the prefilter hook: one regex of all literals (overlaps found)."""
    literals = sorted({lit for lits in sets for lit in lits}, key=len, reverse=True)
    regex = re.compile(b"(?=(" + b"|".join(map(re.escape, literals)) + b"))") if literals else None
    owner = {lit: i for i, lits in enumerate(sets) for lit in lits}

    def find(data, start, end):
        if regex is None:
            return []
        return [(m.start(), owner[m.group(1)]) for m in regex.finditer(data, start, end)]

    return find


# The literal search: the standard library's, hyperscan's (skipped when not installed), and a
# plain-regex one through the same hook; all must give the line-by-line reference's hits.
HYPERSCAN = pytest.param(
    "hyperscan",
    marks=pytest.mark.skipif(not accel.available(), reason="hyperscan not installed (pip install 'gpuops[fast]')"),
)
ENGINES = ["stdlib", HYPERSCAN, "regex-hook"]


def engine_kw(engine: str) -> dict:
    if engine == "hyperscan":
        return {"prefilter": accel.hyperscan_prefilter}
    if engine == "regex-hook":
        return {"prefilter": regex_prefilter}
    return {}


def scan(data: bytes, rules=None, *, cls=Matcher, sizes=None, **kw) -> list[Hit]:
    """All hits of data fed whole (sizes None), in chunks of a fixed size, or in given sizes."""
    m = cls(builtin_rules() + [LOSS_NAN] if rules is None else rules, **kw)
    hits: list[Hit] = []
    if sizes is None:
        hits += m.feed(data)
    else:
        pos = 0
        it = iter(sizes) if not isinstance(sizes, int) else None
        while pos < len(data):
            n = sizes if it is None else next(it)
            hits += m.feed(data[pos : pos + n])
            pos += n
    return hits + m.finish()


def lines_of(data: bytes) -> list[tuple[int, bytes]]:
    """(offset, raw) of every line, split independently of the matcher."""
    out = []
    pos = 0
    for m in re.finditer(rb"\r\n|\r|\n", data):
        out.append((pos, data[pos : m.start()]))
        pos = m.end()
    if pos < len(data):
        out.append((pos, data[pos:]))
    return out


def random_sizes(seed: int, total: int) -> list[int]:
    rnd = random.Random(seed)
    sizes = []
    while sum(sizes) < total:
        sizes.append(rnd.choice([1, 2, 3, 7, 64, 500, 4096, rnd.randint(1, 20000)]))
    return sizes


def sample(name: str) -> bytes:
    return (LOGS / name).read_bytes()


# --- the samples ---


def test_every_expected_sample_exists_and_no_other():
    assert sorted(p.name for p in LOGS.glob("*.txt")) == sorted(EXPECTED)


def test_fx_race_thread_sample_is_reference_text():
    text = sample("fx_race_thread.txt").decode()
    assert text.startswith("Exception in thread drafter-1:\nTraceback (most recent call last):\n")
    assert text.endswith(FX + "\n")
    assert '  File ".../torch/_dynamo/eval_frame.py", line 1120, in compile_wrapper\n' in text


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_sample_hits(name):
    data = sample(name)
    hits = scan(data)
    assert [(h.rule, h.line_number) for h in hits] == EXPECTED[name]
    lines = lines_of(data)
    for hit in hits:
        offset, raw = lines[hit.line_number - 1]
        assert hit.offset == offset
        assert hit.line == raw.decode("utf-8", "replace")
        assert hit.line in hit.excerpt
        assert hit.action == ("warn" if hit.rule in ("recompile-limit", "flex-attention-unfused") else "abort")
        assert hit.description


EXCEPTION_RULES = {r.name for r in builtin_rules() if r.kind == "exception"}


@pytest.mark.parametrize("name", [n for n, hits in EXPECTED.items() if hits and hits[0][0] in EXCEPTION_RULES])
def test_exception_excerpt_runs_from_header_to_exception_line(name):
    for hit in scan(sample(name)):
        lines = hit.excerpt.splitlines()
        assert any(line.endswith("Traceback (most recent call last):") for line in lines)
        assert lines[-1] == hit.line
        assert len(lines) <= matcher_mod.EXCERPT_LINES
        assert len(hit.excerpt) <= matcher_mod.EXCERPT_CHARS


def test_an_exception_line_torn_by_another_thread_still_matches():
    (hit,) = scan(sample("fx_race_all_torn.txt"))
    lines = hit.excerpt.splitlines()
    assert lines[0] == "drafter-3:" and lines[1] == "Traceback (most recent call last):"
    assert lines[-2:] == ["RuntimeError    raise RuntimeError(", hit.line]
    # A torn message needs the torn name right before it, inside an open traceback.
    message = ": " + FX.split(": ", 1)[1] + "\n"
    assert scan(("Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n    f()\n"
                 "loss 2.3\n" + message).encode()) == []
    assert scan(("RuntimeError    raise RuntimeError(\n" + message).encode()) == []


def test_interleaved_threads_each_get_their_own_traceback():
    hits = scan(sample("fx_race_interleaved.txt"))
    for i, hit in enumerate(hits, 1):
        lines = hit.excerpt.splitlines()
        assert lines[0] == f"Exception in thread drafter-{i}:"
        assert lines[1] == "Traceback (most recent call last):"
        assert sum(line.startswith("  File ") for line in lines) == 4


def test_caught_excerpt_names_the_logging_record():
    (hit,) = scan(sample("fx_race_caught.txt"))
    assert hit.excerpt.splitlines()[0].endswith("ERROR [drafter-2] compile failed, falling back to eager")


def test_rank_prefix_stripped_for_matching_kept_in_line():
    (hit,) = scan(sample("fx_race_rank_prefix.txt"))
    assert hit.line == "[rank0]: " + FX


def test_builtin_rule_names_and_order():
    names = [r.name for r in builtin_rules()]
    assert names == [
        "fx-tracing-race",
        "fx-patcher-race",
        "cuda-oom",
        "cuda-error",
        "nccl-watchdog-timeout",
        "nccl-error",
        "compile-failed",
        "segfault",
        "faulthandler-timeout",
        "flex-attention-unfused",
        "recompile-limit",
    ]
    for rule in builtin_rules():
        assert rule.description and "\n" not in rule.description
        assert rule.action in ("abort", "warn")


# --- tracebacks ---


def tb(exc_line: str, prefix: str = "", frames: int = 2, first_prefix: str | None = None) -> str:
    first = prefix if first_prefix is None else first_prefix
    lines = [first + "Traceback (most recent call last):"]
    for i in range(frames):
        lines += [prefix + f'  File "/root/x.py", line {i + 1}, in f{i}', prefix + f"    f{i + 1}()"]
    return "\n".join(lines + [prefix + exc_line]) + "\n"


@pytest.mark.parametrize(
    "text",
    [
        'INFO config: abort_patterns=["RuntimeError: Detected that you are using FX ..."]\n',
        'INFO note: if you see "RuntimeError: Detected that you are using FX to symbolically trace..." upgrade torch\n',
        "    msg = 'RuntimeError: Detected that you are using FX to symbolically trace a dynamo-optimized function'\n",
        FX + "\n",
        "step 1\n" + FX + "\n",
        'print("Traceback (most recent call last):")\n' + FX + "\n",
    ],
)
def test_mentions_do_not_match(text):
    assert scan(text.encode()) == []


def test_exception_line_needs_a_recent_header():
    far = "Traceback (most recent call last):\n" + "  File \"x\", line 1, in f\n" + "other line\n" * 600 + FX + "\n"
    assert scan(far.encode()) == []
    window = "Traceback (most recent call last):\n" + "  File \"x\", line 1, in f\n" + "other line\n" * 400 + FX + "\n"
    assert [h.line_number for h in scan(window.encode())] == [403]


def test_header_prefix_on_the_traceback_line_only():
    text = tb(FX, first_prefix="2026-11-29 10:00:01,234 ERROR [drafter-2] ")
    (hit,) = scan(text.encode())
    assert hit.excerpt.splitlines()[0].startswith("2026-11-29 10:00:01,234 ERROR [drafter-2] Traceback")


def test_timestamp_prefix_on_every_line_varies():
    lines = tb(FX).splitlines()
    text = "".join(f"2026-11-29T10:00:{i:02d}.{i * 7:03d}Z stderr F {line}\n" for i, line in enumerate(lines))
    (hit,) = scan(text.encode())
    assert hit.line_number == len(lines)


def test_two_ranks_interleaved():
    a = tb(FX, prefix="[rank0]: ").splitlines()
    b = tb("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.", prefix="[rank1]: ").splitlines()
    text = "".join(x + "\n" + y + "\n" for x, y in zip(a, b, strict=False))  # as far as both go
    hits = scan(text.encode())
    assert [h.rule for h in hits] == ["fx-tracing-race", "cuda-oom"]
    assert all("[rank1]" not in line for line in hits[0].excerpt.splitlines())
    assert all("[rank0]" not in line for line in hits[1].excerpt.splitlines())


def test_chained_exception_and_multiline_message():
    text = (
        tb("KeyError: 'x'")
        + "\nThe above exception was the direct cause of the following exception:\n\n"
        + tb("torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised:")
        + "RuntimeError: CUDA error: an illegal memory access was encountered\n"
    )
    hits = scan(text.encode())
    assert [h.rule for h in hits] == ["compile-failed"]
    assert "KeyError" not in hits[0].excerpt


def test_other_output_between_traceback_lines():
    lines = tb(FX).splitlines()
    noisy = []
    for line in lines:
        noisy += [line, "2026-11-29 10:00:01,240 INFO step 7 loss 2.1"]
    (hit,) = scan(("\n".join(noisy) + "\n").encode())
    assert "INFO step" not in hit.excerpt


def test_deep_traceback_excerpt_is_bounded():
    (hit,) = scan(tb(FX, frames=2000).encode())
    lines = hit.excerpt.splitlines()
    assert len(lines) <= matcher_mod.EXCERPT_LINES
    assert len(hit.excerpt) <= matcher_mod.EXCERPT_CHARS
    assert lines[0] == "Traceback (most recent call last):"
    assert lines[-1] == FX
    assert any("lines not shown" in line for line in lines)


def test_open_tracebacks_are_bounded():
    m = Matcher(builtin_rules())
    m.feed(b"Traceback (most recent call last):\n" * 1000)
    assert len(m._tracebacks) <= matcher_mod.MAX_OPEN_TRACEBACKS


# --- line rules ---


def test_faulthandler_timeout_needs_a_stack_soon_after():
    stack = 'Thread 0x00007f2b8effd640 (most recent call first):\n  File "x.py", line 1 in f\n'
    assert [h.rule for h in scan(("Timeout (0:04:00)!\n" + stack).encode())] == ["faulthandler-timeout"]
    assert [h.rule for h in scan(("Timeout (0:00:02.500000)!\nCurrent thread 0x00007f3d (most recent call first):\n").encode())] == [
        "faulthandler-timeout"
    ]
    assert scan(b"Timeout (0:04:00)!\nstep 1\nstep 2\n") == []
    assert [h.line_number for h in scan(("x\nTimeout (0:04:00)!\n" + "a\n" * 4 + stack).encode())] == [2]
    assert scan(("Timeout (0:04:00)!\n" + "a\n" * 5 + stack).encode()) == []


def test_faulthandler_hit_across_feeds():
    m = Matcher(builtin_rules())
    assert m.feed(b"step 1\nTimeout (0:04:00)!\nstep") == []
    (hit,) = m.feed(b" 2\nThread 0x00007f2b8effd640 (most recent call first):\n")
    assert (hit.rule, hit.line_number, hit.offset) == ("faulthandler-timeout", 2, 7)
    assert hit.excerpt.splitlines()[0] == "Timeout (0:04:00)!"


@pytest.mark.parametrize(
    "line, rule",
    [
        ("Fatal Python error: Aborted", "segfault"),
        ("[rank3]: Fatal Python error: Segmentation fault", "segfault"),
        ("Segmentation fault (core dumped)", "segfault"),
        ("bash: line 1:  4242 Segmentation fault      (core dumped) python train.py", "segfault"),
        ("[1]+  Segmentation fault      (core dumped) python train.py", "segfault"),
        ("note: Fatal Python error: is printed by faulthandler", None),
        ("grep 'Segmentation fault' old.log", None),
        ("Segmentation fault handling is documented", None),
        ("W1129 10:50:01.345000 4242 torch/_dynamo/convert_frame.py:1551] [2/8] torch._dynamo hit config.cache_size_limit (8)", "recompile-limit"),
        ("hint: torch._dynamo hit config.recompile_limit means warmup missed a shape", None),
        ("[E ProcessGroupNCCL.cpp:737] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1)", "nccl-watchdog-timeout"),
    ],
)
def test_line_rules(line, rule):
    assert [h.rule for h in scan((line + "\n").encode())] == ([rule] if rule else [])


def test_playbook_regex_rule():
    assert [h.rule for h in scan(b"step 12 loss nan\n")] == ["loss-nan"]
    assert [h.rule for h in scan(b"step 12 loss inf lr 3e-4\n")] == ["loss-nan"]
    assert scan(b"step 12 loss nanny\n") == []
    assert LOSS_NAN.triggers == ("loss inf", "loss nan")


def test_warn_and_abort_actions():
    rules = [regex_rule("slow", r"tok/s [0-9]{1,3}$", action="warn"), regex_rule("nan", r"loss nan")]
    hits = scan(b"step 1 loss nan tok/s 48211\nstep 2 loss 2.0 tok/s 951\n", rules)
    assert [(h.rule, h.action) for h in hits] == [("nan", "abort"), ("slow", "warn")]


def test_frequent_literal_lines_without_a_match_are_skipped_exactly():
    rules = builtin_rules() + [regex_rule("diverged", r"loss [0-9]{3,}\.")]
    steps = "".join(f"step {i} loss {2 + i / 1000:.4f}\n" for i in range(2000))
    data = (steps + "step 2000 loss 123.4\nTimeout (0:04:00)!\nloss 1.0\n" + "Thread 0x7f (most recent call first):\n").encode()
    hits = scan(data, rules)
    assert [(h.rule, h.line_number) for h in hits] == [("diverged", 2001), ("faulthandler-timeout", 2002)]
    assert hits == scan(data, rules, cls=LineByLine)
    assert hits[1].excerpt.splitlines() == ["Timeout (0:04:00)!", "loss 1.0", "Thread 0x7f (most recent call first):"]


def test_first_matching_rule_wins_per_line():
    rules = [regex_rule("first", r"loss"), regex_rule("second", r"nan")]
    assert [h.rule for h in scan(b"loss nan\nnan\n", rules)] == ["first", "second"]


def test_bad_regex_rule():
    with pytest.raises(ValueError, match=r"rule 'broken': bad pattern 'loss \(nan'"):
        regex_rule("broken", r"loss (nan")
    with pytest.raises(ValueError, match="action must be abort or warn"):
        regex_rule("x", "y", action="kill")
    with pytest.raises(ValueError, match="kind must be one of"):
        Rule("x", "grep", "abort", "d", "y")


def test_required_literals():
    lits = matcher_mod._required_literals
    assert lits(re.compile(r"Watchdog caught (collective)? timeout")) == ("Watchdog caught ",)
    assert lits(re.compile(r"^x(ab|cd)\d+Error: (CUDA|NCCL) error")) == ("Error: CUDA error", "Error: NCCL error")
    assert lits(re.compile(r"foo|barbaz")) == ("barbaz", "foo")
    assert lits(re.compile(r"^\d+$")) == ()
    assert lits(re.compile(r"(?i)loss nan")) == ()
    assert lits(re.compile(r"(?i:loss) nan")) == (" nan",)  # only the case-sensitive part


def test_rule_without_literals_checks_every_line():
    rules = [regex_rule("digits", r"^\d+$")]
    assert rules[0].triggers == ()
    text = b"a\r12\r\nb\x1b[1m34\x1b[0m\n56"
    assert [(h.line_number, h.line) for h in scan(text, rules)] == [(2, "12"), (4, "56")]
    # (?i) and lookarounds are fine too; a too-long line is matched on its first max_line bytes
    rules = [regex_rule("nan", r"(?i)loss nan(?!ny)"), regex_rule("end", r"x$")]
    assert rules[0].triggers == ()
    text = b"LOSS NaN\nloss nanny\n" + b"a" * 9 + b"x" + b"y" * 5 + b"\r\n"
    hits = scan(text, rules, max_line=10)
    assert [(h.rule, h.line_number) for h in hits] == [("nan", 1), ("end", 3)]
    assert hits == scan(text, rules, max_line=10, cls=LineByLine)


# --- bytes, lines, offsets ---


def test_line_ends_cr_crlf_lf_and_offsets():
    data = b"a\rb\r\nc\nd\r\re\n" + FX.encode() + b"\n"
    rules = [regex_rule("any", r"^[a-e]$")]
    hits = scan(data, rules, start_offset=1000)
    assert [(h.line, h.line_number, h.offset) for h in hits] == [
        ("a", 1, 1000),
        ("b", 2, 1002),
        ("c", 3, 1005),
        ("d", 4, 1007),
        ("e", 6, 1010),
    ]


def test_crlf_split_across_feeds_is_one_line_end():
    m = Matcher([regex_rule("x", "^x$")])
    assert m.feed(b"a\r") == []
    assert m.feed(b"\nx\r") == [Hit("x", "abort", m._rules[0].description, "x", 2, 3, "x")]
    assert m.feed(b"\n\nx") == []
    assert [(h.line_number, h.offset) for h in m.finish()] == [(4, 7)]


def test_tqdm_carriage_returns_then_traceback():
    bar = "".join(f"\r {p}%|███▏      | {p}/100 [00:04<00:05, 9.8it/s]" for p in range(30, 43))
    data = ("epoch 1\n" + bar + "\r" + tb(FX)).encode()
    (hit,) = scan(data)
    assert hit.line_number == 1 + 1 + 13 + 6  # "epoch 1", the empty line before the first \r, bars, traceback


def test_ansi_escapes_removed():
    red = tb("\x1b[31mRuntime\x1b[0mError: CUDA error: device-side assert triggered\x1b[0m\x1b[K")
    osc = "\x1b]0;training\x07step 3 lo\x1b[1mss nan\n"
    hits = scan((red + osc).encode())
    assert [(h.rule, h.line) for h in hits] == [
        ("cuda-error", "RuntimeError: CUDA error: device-side assert triggered"),
        ("loss-nan", "step 3 loss nan"),
    ]


def test_invalid_utf8_tolerated():
    data = b"\xff\xfe garbage \xc3\n" + tb("torch.OutOfMemoryError: CUDA out of memory. \xe9").encode("latin-1")
    (hit,) = scan(data)
    assert hit.rule == "cuda-oom"
    assert hit.line.endswith("memory. \ufffd")


def test_ten_megabyte_line_without_newline_is_not_buffered():
    m = Matcher(builtin_rules(), max_line=4096)
    piece = b"x" * 65536
    tracemalloc.start()
    for _ in range(160):  # 10 MiB
        assert m.feed(piece) == []
        assert m.buffered_bytes <= 4096
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 1 << 20
    trace = tb(FX).encode()
    hits = m.feed(b"\n" + trace) + m.finish()
    assert [(h.rule, h.line_number, h.offset) for h in hits] == [
        ("fx-tracing-race", 7, 160 * 65536 + 1 + trace.index(FX.encode()))
    ]


def test_long_line_keeps_only_its_start():
    rules = [regex_rule("nan", "loss nan")]
    early = b"loss nan" + b"x" * (10 << 20) + b"\n"
    late = b"x" * (10 << 20) + b"loss nan\n"
    assert [h.line_number for h in scan(early + late, rules, max_line=1000)] == [1]
    (hit,) = scan(early, rules, max_line=1000)
    assert len(hit.line) == 1000
    assert [h.line_number for h in scan(early + late, rules, max_line=1000, sizes=1 << 16)] == [1]


# --- chunking and the fast path ---


def mixed_log(seed: int) -> bytes:
    """Random mix of samples, tqdm bars, CRLF, ANSI, invalid bytes and near-misses."""
    rnd = random.Random(seed)
    parts = [sample(n) for n in EXPECTED]
    extra = [
        b"2026-11-29 10:00:00,000 INFO step 5 loss 2.3 tok/s 48211\n",
        b"\r 42%|\xe2\x96\x88\xe2\x96\x88\xe2\x96\x88\xe2\x96\x8f      | 42/100 [00:04<00:05, 9.8it/s]",
        b"step 9 loss nan\r\n",
        b"\x1b[33mWARNING\x1b[0m grad norm 12.3\r\n",
        b"\xff\xfe broken \xc3(\n",
        b"Timeout (0:04:00)!\n",
        b"Thread 0x00007f2b8effd640 (most recent call first):\n",
        b"Traceback (most recent call last):\n",
        b'  File "x.py", line 1, in f\n',
        FX.encode() + b"\n",
        b"\r",
        b"\n",
        b"[rank0]: Traceback (most recent call last):\n",
        b"Exception in thread drafter-9:\n",
        b"RuntimeError    raise RuntimeError(\n",
        b": " + FX.split(": ", 1)[1].encode() + b"\n",
    ]
    out = []
    for _ in range(300):
        out.append(rnd.choice(parts) if rnd.random() < 0.15 else rnd.choice(extra))
    return b"".join(out)


@pytest.mark.parametrize("engine", ENGINES)
def test_chunk_sizes_give_identical_hits(engine):
    kw = engine_kw(engine)
    # A sample may end inside a traceback (the torn race leaves two open, as the real log did):
    # the samples are kept further apart than a traceback stays open, so each gives its own hits.
    apart = b"\n" * (matcher_mod.TRACEBACK_WINDOW + 1)
    data = apart.join(sample(n) for n in sorted(EXPECTED))
    whole = scan(data, **kw)
    assert [h.rule for h in whole] == [rule for n in sorted(EXPECTED) for rule, _ in EXPECTED[n]]
    for size in range(1, 130):
        assert scan(data, sizes=size, **kw) == whole, size
    for seed in range(20):
        assert scan(data, sizes=random_sizes(seed, len(data)), **kw) == whole, seed


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("seed", range(12))
def test_fast_path_matches_line_by_line_reference(seed, engine):
    kw = engine_kw(engine)
    data = mixed_log(seed)
    reference = scan(data, cls=LineByLine)
    assert scan(data, **kw) == reference
    assert scan(data, sizes=random_sizes(seed, len(data)), **kw) == reference
    assert scan(data, sizes=1 + seed % 5, **kw) == reference
    lines = lines_of(data)
    for hit in reference:
        offset, raw = lines[hit.line_number - 1]
        assert hit.offset == offset
        assert hit.line == raw.decode("utf-8", "replace")  # these lines carry no escape sequence


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("prefix, raw, shown", [
    ("", b"\x1b[1;31m" + FX.encode() + b"\x1b[0m", FX),  # a coloured exception line
    ("", b"\x1b[2K\x1b[A" + FX.encode() + b" \xff\xfe", FX + " \ufffd\ufffd"),  # cursor moves; bytes not UTF-8
    ("", b"\x1b]0;train\x07" + FX.encode(), FX),  # a terminal title (OSC)
    ("[rank0]: ", b"[rank0]: \x1b[31m" + FX.encode() + b"\x1b[m", "[rank0]: " + FX),
])
def test_a_matched_line_is_shown_as_text_without_escape_sequences(engine, prefix, raw, shown):
    """What the user reads in the abort message and the JSON `line`: the text, colours and cursor codes gone."""
    header = tb("", prefix).encode()[: -len(prefix) - 1]  # the traceback up to its exception line
    (hit,) = scan(header + raw + b"\n", **engine_kw(engine))
    assert (hit.rule, hit.line) == ("fx-tracing-race", shown)


def training_log(seed: int, size: int) -> bytes:
    """Step lines and tqdm bars (CR, some bars closed by LF) with rare specials spliced in."""
    rnd = random.Random(seed)
    specials = [
        b"step 7 loss nan\n",
        b"[rank1]: Fatal Python error: Aborted\r\n",
        tb(FX).encode(),
        b"Timeout (0:04:00)!\nThread 0x7f (most recent call first):\n",
        b"W1129 torch._dynamo hit config.recompile_limit (8)\n",
        b"\x1b[31mSegmentation fault\x1b[0m\n",
    ]
    out, n, step = [], 0, 0
    while n < size:
        r = rnd.random()
        if r < 0.6:
            step += 1
            s = f"INFO step {step} loss {rnd.uniform(1, 3):.4f} grad_norm {rnd.uniform(0, 2):.2f}\n".encode()
        elif r < 0.995:
            bars = range(rnd.randint(0, 95), 100, 7)
            s = "".join(f"\r{q:3d}%|{'#' * (q // 10)}| {q}/100 [00:01<00:02]" for q in bars).encode()
            s += rnd.choice([b"", b"", b"\n", b"\r\n"])
        else:
            s = rnd.choice(specials)
        out.append(s)
        n += len(s)
    return b"".join(out)


@pytest.mark.parametrize("engine", ENGINES)
def test_long_training_log_matches_reference(engine):
    data = training_log(1, 3 << 20)
    reference = scan(data, cls=LineByLine)
    assert len(reference) > 20
    assert scan(data, sizes=1 << 20, **engine_kw(engine)) == reference
    assert scan(data, sizes=random_sizes(1, len(data)), **engine_kw(engine)) == reference


@pytest.mark.parametrize(
    "eol", [b"\r\n", b"\r", b"\r no separator here\n", b"\r 5%\n"], ids=["crlf", "cr", "cr-text-lf", "cr-bar-lf"]
)
def test_line_end_counting_on_cr_heavy_logs(eol):
    lines = [b"step %d" % i for i in range(3000)] + [b"step 9 loss nan"] + [b"x"] * 3000 + [b"loss inf"]
    data = eol.join(lines) + eol
    reference = scan(data, cls=LineByLine)
    assert [h.rule for h in reference] == ["loss-nan", "loss-nan"]
    assert scan(data, sizes=4096) == reference
    assert scan(data, sizes=random_sizes(2, len(data))) == reference


def test_anchor_bytes_follow_the_log(monkeypatch):
    """Literals are found through a byte rare in the log; when it turns frequent the
    chunk falls back to searching and the next chunk chooses again: same hits."""
    monkeypatch.setattr(scan_mod, "_SAMPLE", 4096)
    monkeypatch.setattr(scan_mod, "_REPLAN", 16384)
    quiet = training_log(2, 1 << 18)
    noisy = b"".join(b"Warning %d: PPPP Segment fault Watch (x)\n" % i for i in range(4000))
    data = quiet + noisy + b"Segmentation fault\n" + quiet + noisy
    m = Matcher(builtin_rules() + [LOSS_NAN])
    hits: list[Hit] = []
    anchors = []
    for pos in range(0, len(data), 32768):
        hits += m.feed(data[pos : pos + 32768])
        anchors.append(set(m._literals.anchors))
    hits += m.finish()
    assert hits == scan(data, cls=LineByLine)
    assert any(ord("P") in a for a in anchors) and any(a and ord("P") not in a for a in anchors)


def test_prefilter_hook_compiles_each_literal_set_once():
    calls = []

    def prefilter(sets):
        calls.append(sets)
        return regex_prefilter(sets)

    data = training_log(3, 1 << 18)
    m = Matcher(builtin_rules() + [LOSS_NAN], prefilter=prefilter)
    hits = [h for pos in range(0, len(data), 4096) for h in m.feed(data[pos : pos + 4096])] + m.finish()
    assert hits == scan(data, cls=LineByLine)
    assert calls and len(calls) == len(set(calls))
    assert all((b"loss inf", b"loss nan") in sets for sets in calls)  # no byte of it is rare in this log
    assert all(isinstance(lit, bytes) for sets in calls for lits in sets for lit in lits)


@pytest.mark.parametrize("engine", ENGINES)
def test_every_literal_searched_without_anchors(engine, monkeypatch):
    monkeypatch.setattr(scan_mod, "_NOT_ANCHORS", frozenset(range(256)))
    for seed in range(4):
        data = mixed_log(seed) + training_log(seed, 1 << 17)
        reference = scan(data, cls=LineByLine)
        assert scan(data, sizes=random_sizes(seed, len(data)), **engine_kw(engine)) == reference


@pytest.mark.skipif(not accel.available(), reason="hyperscan not installed (pip install 'gpuops[fast]')")
def test_hyperscan_finder_reports_every_occurrence():
    sets = ((b"abc", b"bcd"), (b"cda",), (b"(x",))
    find = accel.hyperscan_prefilter(sets)
    rnd = random.Random(7)
    data = bytes(rnd.choice(b"abcdx(\n") for _ in range(20000))
    for start, end in ((0, len(data)), (17, 9000), (5000, 5001)):
        expected = {
            (p, i)
            for i, lits in enumerate(sets)
            for lit in lits
            for p in range(start, end - len(lit) + 1)
            if data.startswith(lit, p)
        }
        assert sorted(find(data, start, end)) == sorted(expected)
    assert accel.hyperscan_prefilter(())(data, 0, len(data)) == []


def test_accel_matcher_uses_hyperscan_when_available():
    m = accel.matcher(builtin_rules(), start_offset=5)
    assert isinstance(m, Matcher)
    assert (m._literals._prefilter is accel.hyperscan_prefilter) == accel.available()
    (hit,) = m.feed(tb(FX).encode()) + m.finish()
    assert (hit.rule, hit.offset) == ("fx-tracing-race", 5 + tb(FX).index(FX))


def test_empty_trigger_means_every_line_is_searched():
    rule = Rule("any-x", "line", "abort", "d", r"x$", triggers=("",))
    assert [h.line_number for h in scan(b"a\nbx\nc\n", [rule])] == [2]
