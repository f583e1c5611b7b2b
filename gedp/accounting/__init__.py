"""Accounting of the privacy budget: the lifetime ledger, lifetime and annual caps, limits on a
config's mu, and quarters' budgets."""
