"""kiln's benchmark suite: `python -m bench` (see bench/__main__.py and bench/RESULTS.md).

Nothing here imports torch at package import, so `__main__` can set threads and cache folders first.
"""
