"""Running a protection: the engine (local or dask), the pool of worker processes by state, one state's
release pipeline, a release recorded in the ledger, panels quarter by quarter, and the process's settings
(memory, how it ends)."""
