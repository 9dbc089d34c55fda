"""One module per command (`X_cmd.py`: `run_X`, called by its click function in cli/main.py). A command
module imports no other: what two commands share is a flow (cli/flows/), a renderer or a report."""
