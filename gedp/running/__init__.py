"""Running a protection: the engine (local or dask), the pool of worker processes by state, one state's
release pipeline, panels quarter by quarter, and the process's settings (memory, CPUs, how it ends)."""
