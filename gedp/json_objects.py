"""JSON objects read as untrusted input: each key once (Python's reader keeps the last of a repeated
key silently, so two readers of one file could see different values: the ledger, a release's manifest)."""

from __future__ import annotations

#: The message of the ValueError a repeated key raises.
REPEATED_KEY = "a key appears twice in one object"


def unique_pairs(pairs: list) -> dict:
    """``json.loads``' ``object_pairs_hook``: the object, or ValueError for a key it holds twice."""
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError(REPEATED_KEY)
    return dict(pairs)
