"""Telling the operator (playbook `notify:`): notifications the watchdog sends, from the target.

payload (what a notification says: one JSON object, its one line of text), deliver (one delivery through a
channel: the Sender every channel kind's class extends, each try bounded, retried with backoff), one module
per channel kind, named by its entry in wire/channel_list.py (webhook: one POST, bounded in all, never
redirected; shellcmd: a command run on the target), said (what a hook or a command said, control characters
escaped), outbox (notify.jsonl: what was queued and delivered, so a restarted watchdog sends no second copy;
the watchdog's side, which hands each notification to a detached sender), sender (the `notify` tool that
delivers one notification, in order per channel, and `notify-test`).
Standard library only, like the rest of the agent.
"""
