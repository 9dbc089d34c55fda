"""What a command records beside its renderer, to a file: --junit (junit.py), --report (html/: the run's HTML
report, also `gpuops report`), both at once (both.py), and the check that a report's path can be written
before anything runs (writable.py)."""
