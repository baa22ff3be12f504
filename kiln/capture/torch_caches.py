"""torch's process-wide caches that would keep every finished compile alive, emptied after each one.

ShapeEnv memoizes several of its methods in caches that live on the class, keyed by the ShapeEnv
itself, and torch empties them only when the next caller's version counter differs from the last
one's; ShapeEnvs of identical little graphs end at equal counters, so each finished compile's
ShapeEnv (its symbols, sources and guards) stayed reachable forever, about 60 KB per dynamic
compile in bench/soak.py. torch.compile keeps them the same way. Emptying those caches when a
compile is done only costs recomputing an answer for a compile still running (there is none: kiln
compiles one frame at a time).
"""
import functools


def release_finished_compiles():
    for cache in _shape_env_method_caches():
        cache.cache_clear()


@functools.lru_cache(maxsize=None)
def _shape_env_method_caches():
    from torch.fx.experimental.symbolic_shapes import ShapeEnv  # loaded by the compile that just finished
    return tuple(v for v in vars(ShapeEnv).values() if callable(getattr(v, "cache_clear", None)))
