"""Privacy: neighbor functions, budget plans, group-by queries and the noise mechanisms."""
