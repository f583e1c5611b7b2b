"""``gedp implicates --processes N`` forks at most the CPUs the process may use (red team rt28 J4:
``--processes 1000 --n 1000`` forked 1,000 workers); the draws do not depend on N."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(("asked", "cpus", "expected"), [(1000, 2, 2), (3, 8, 3), (1, 4, 1), (2, 2, 2)])
def test_workers_are_at_most_the_usable_cpus(monkeypatch, asked, cpus, expected):
    """The map ``worker_map(asked)`` runs its tasks on min(asked, usable CPUs) workers. Power: the code
    before gave ``asked`` (1,000 for the first case)."""
    from gedp.cli import table_commands
    from gedp.planning import workers

    seen = []
    monkeypatch.setattr(workers, "usable_cpus", lambda: cpus)
    monkeypatch.setattr(workers, "parallel_map", lambda *args, **kwargs: seen.append(kwargs["workers"]))
    table_commands.worker_map(asked)(None, None, [1, 2, 3], None)
    assert seen == [expected]
