"""tfscale's steps, one subpackage per layer, each importing only from its own layer and the
layers below it (`tests/test_layout.py` checks; `docs/architecture.md` draws it):

core (1) < settings (2) < data (3) < distribute (4) < train (5) < measure (6) < execute (7)
< report (8) < track (9); `flows/` (10) orders them and holds no logic of its own.
"""
