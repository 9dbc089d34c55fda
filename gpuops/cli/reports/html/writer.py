"""`--report FILE` on launch and logs -f: the run's HTML report, written when the command ends.

Like --junit it sits beside the renderer and sees what is rendered; when a target's outcome comes
(the run ended, was detached, or the command was interrupted) it reads that run's records at once,
while the connection is still open, and at the end writes one page with a section per target. A
target whose records cannot be read (the connection gave up) still gets its section: the outcome
the command said and why the records are missing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

from gpuops.cli.reports.writable import check_writable
from gpuops.client.events import Event, Outcome
from gpuops.errors import GpuopsError

if TYPE_CHECKING:
    from types import TracebackType

    from gpuops.cli.roles import Render
    from gpuops.client.play import Play


@dataclass
class _Target:
    play: Play
    run: str | None = None
    said: dict[str, Any] = field(default_factory=dict)
    message: str = ""
    record: dict[str, Any] | None = None
    missing: str = ""


def fetch(play: Play, run_id: str | None) -> dict[str, Any]:
    """The run's records through the play's door (one round trip)."""
    return play.door.report(run_id, play.session)


def build(sections: Sequence[tuple[str, dict[str, Any] | None, dict[str, Any], str, str, Callable[[str], str]]],
          command: str) -> str:
    """The page for (target, record or None, what the command said, its message, why the record is missing, mask)."""
    from gpuops.cli.reports.html.page import Section, page
    from gpuops.cli.reports.html.story import story

    out = []
    for target, record, said, message, missing, mask in sections:
        if record is not None:
            try:
                out.append(Section(target, story(record, target, said, mask)))
            except Exception as exc:  # noqa: BLE001 - a record this report cannot draw costs its section, not the page
                outcome = said.get("outcome") or (record.get("profile") or {}).get("outcome") or ""
                out.append(Section(target, None, "", (str(outcome), mask(message)), undrawn=mask(f"{type(exc).__name__}: {exc}")))
        else:
            out.append(Section(target, None, mask(missing), (str(said.get("outcome") or ""), mask(message))))
    return page(out, command)


class HtmlReport:
    """A context manager around launch / logs -f: records which run each target followed; writes PATH at the end."""

    def __init__(self, path: str | None, command: str, *, say: bool = True) -> None:
        self.path, self.command, self.say = path, command, say
        self.targets: dict[str, _Target] = {}
        if path:
            check_writable(path, "--report")

    def wrap(self, render: Render, play: Play) -> Render:
        if not self.path:
            return render
        self.targets[play.target.name] = _Target(play)
        return _Tee(render, self, play.target.name)

    def event(self, name: str, ev: Event) -> None:
        if ev.run and name in self.targets:
            self.targets[name].run = ev.run

    def outcome(self, name: str, out: Outcome) -> None:
        t = self.targets.get(name)
        if t is None:
            return
        t.run = out.data.get("run") or t.run
        t.said = {"outcome": out.outcome, "exit_code": out.exit_code,
                  **{k: out.data[k] for k in ("rule", "excerpt", "stacks") if out.data.get(k)}}
        t.message = out.message
        self._read(t)

    def _read(self, t: _Target) -> None:
        if t.record is not None:
            return
        if t.run is None:
            t.missing = "no run was created"
            return
        try:
            t.record = fetch(t.play, t.run)
        except GpuopsError as exc:
            t.missing = str(exc)
        except KeyboardInterrupt:  # a second Ctrl-C while reading: the page says what the command knew
            t.missing = "interrupted while reading the run's records"

    def __enter__(self) -> HtmlReport:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if not self.path:
            return
        import sys

        for t in self.targets.values():
            if exc is not None and not t.said:
                t.said = {"outcome": "error", "exit_code": getattr(exc, "exit_code", 1)}
                t.message = str(exc)
            try:
                self._read(t)
            except Exception as err:  # noqa: BLE001 - the page is still written with what is known
                t.missing = f"{type(err).__name__}: {err}"
        sections = [(name, t.record, t.said, t.message, t.missing, t.play.mask) for name, t in self.targets.items()]
        try:
            text = build(sections, f"gpuops {self.command}")
        except Exception as err:  # noqa: BLE001 - the report never changes the run's exit code
            said = f"{type(err).__name__}: {err}"
            for t in self.targets.values():
                said = t.play.mask(said)
            sys.stderr.write(f"gpuops: warning: the run's report could not be drawn ({said}); {self.path} not written\n")
            return
        try:
            from gpuops.cli.reports.html.page import write

            write(self.path, text)
            if self.say and self.targets:
                from gpuops.cli.renderers import style

                if not style.QUIET:
                    sys.stderr.write(f"gpuops: the run's report: {self.path}\n")
        except OSError as err:
            sys.stderr.write(f"gpuops: error: could not write the report {self.path}: {err.strerror or err}\n")


class _Tee:
    """The renderer the command uses: everything goes to the real one (or the JUnit recorder), then here."""

    def __init__(self, inner: Render, report: HtmlReport, name: str) -> None:
        self._inner, self._report, self._name = inner, report, name

    def event(self, ev: Event) -> None:
        self._inner.event(ev)
        self._report.event(ev.target or self._name, ev)

    def outcome(self, out: Outcome, target: str | None = None) -> None:
        self._inner.outcome(out, target)
        self._report.outcome(target or self._name, out)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
