"""Target profiles, target families and the `vitedge targets` table."""
