"""Many files as one dataset: open, select, order, scan, tabulate, view and stack."""
