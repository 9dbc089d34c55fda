"""A run's life on the target: its directory made (prepare), started (start), stopped (abort), restarted
(restart, attempt), listed (history), and whether its training still runs (liveness).

Target side only: nothing here is imported by the client. Standard library only.
"""
