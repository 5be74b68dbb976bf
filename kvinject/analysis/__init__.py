"""Analysis: statistics over runs and items, results read back from stores and files, tables,
reports and plots."""
