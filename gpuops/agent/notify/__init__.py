"""Telling the operator (playbook `notify:`): notifications the watchdog sends, from the target.

payload (what a notification says: one JSON object, its one line of text), deliver (one webhook POST
or command, with its retries), outbox (notify.jsonl: what was queued and delivered, so a restarted
watchdog sends no second copy; the watchdog's side, which hands each notification to a detached
sender), sender (the `notify` tool that delivers one notification, and `notify-test`). Standard
library only, like the rest of the agent.
"""
