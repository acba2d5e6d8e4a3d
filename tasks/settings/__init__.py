"""Layer 2, what a user may ask for: the typed, frozen config read from `params.yaml` and
flags (`config`), and the table of strategy kinds it may name (`kinds`), pure data. The
kinds' builders and epoch runners live in the layers that own them
(`tasks/distribute/builders.py`, `tasks/train/steps.py`) and are bound late, by name (the
layout test reads those names)."""
