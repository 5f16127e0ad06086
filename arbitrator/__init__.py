"""vrepl's standalone arbitrator (`vrepl-arbitrator`): see arbitrator/server.py and
docs/arbitrator.md."""
