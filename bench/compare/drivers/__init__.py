"""One driver per system under test; the interface is in base.py."""
