"""vrepl.instance: the production parts of a sync instance around its driver (vrepl/sync.py).

Owns: the app port over the embedding's callbacks (app.py) and the any-thread intake of the
app's forwards and acks (intake.py).
Must not: execute actions (vrepl/driver does) or import vrepl.sync.
"""
