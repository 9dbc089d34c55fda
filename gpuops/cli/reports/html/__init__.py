"""The run's report: one self-contained HTML file (summary, plots over the run's time, stacks), drawn here
from the agent's `report` reply (story: what it says; happened: its events in words; stack_view: every
attempt's stacks; plot: the SVG charts; page: the document; writer: `--report FILE` on launch and logs -f)."""
