"""Seeing what kiln did: logs (KILN_LOGS), explain, trace dumps."""
