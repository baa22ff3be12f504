"""Code generators for scheduled programs: `cpp` (C++/OpenMP for CPU); a `triton` one for GPUs
would take the same Program and return (source, entries)."""
