"""Run untrusted programs under limits."""
