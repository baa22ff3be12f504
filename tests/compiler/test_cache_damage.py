"""The disk caches treat every read as untrusted input.

A damaged, truncated or unreadable cache file is a miss (rebuilt, one warning), never an error and
never trusted; a library only loads for the key it was built for (entries swapped together with
their checksums are rebuilt, in a fresh process too); and a cache directory another user could swap
(through a directory above it) is refused.
"""
import os
import pathlib
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import kiln
from kiln.compiler import build, graph_cache


from tests.compiler.test_build import cache  # noqa: F401,E402  the fixture: a fresh cache directory and counters


@pytest.fixture(autouse=True)
def fresh_graph_cache_counters(monkeypatch):
    monkeypatch.setattr(graph_cache, "stats", graph_cache.GraphCacheStats())


def _source(tag, value=1):
    return f'extern "C" int kiln_test_entry(int x) {{ return x + {value}; }}\n// {tag}\n'


def _files(cache, suffix):
    return sorted((cache / "cpp").rglob(f"*{suffix}"))


def _replace(path, data):
    """New contents under a new inode (this process may still map the old library)."""
    if path.is_dir():
        path.rmdir()
    tmp = path.with_name(path.name + ".new")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _make_dir(path):
    path.unlink()
    path.mkdir()


DAMAGES = {
    "digest not utf-8": lambda so, digest, cpp: _replace(digest, b"\xff\xfe\x80 not text"),
    "digest empty": lambda so, digest, cpp: _replace(digest, b""),
    "digest of another file": lambda so, digest, cpp: _replace(digest, b"kiln-library-2 " + b"0" * 64),
    "digest a directory": lambda so, digest, cpp: _make_dir(digest),
    "library empty": lambda so, digest, cpp: _replace(so, b""),
    "library not utf-8 garbage": lambda so, digest, cpp: _replace(so, bytes(range(256)) * 4),
    "library a directory": lambda so, digest, cpp: _make_dir(so),
    "source not utf-8, library gone": lambda so, digest, cpp: (_replace(cpp, b"\xff\xff\xc3("), so.unlink()),
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_cache_file_is_rebuilt_with_one_warning(cache, monkeypatch, damage):
    source = _source(damage)
    build.load_library(source)
    [so], [digest], [cpp] = _files(cache, ".so"), _files(cache, ".sha256"), _files(cache, ".cpp")
    DAMAGES[damage](so, digest, cpp)
    monkeypatch.setattr(build, "_loaded", {})  # as a fresh process
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lib = build.load_library(source)
    assert lib.kiln_test_entry(1) == 2
    assert build.stats.builds == 2
    damaged = [w for w in caught if "is damaged" in str(w.message)]
    expected = 0 if damage == "source not utf-8, library gone" else 1  # a missing library is a plain miss
    assert len(damaged) == expected, [str(w.message) for w in caught]
    monkeypatch.setattr(build, "_loaded", {})
    assert build.load_library(source).kiln_test_entry(1) == 2 and build.stats.disk_hits == 1


def test_a_file_where_a_cache_directory_belongs_is_removed(cache, monkeypatch):
    source = _source("file for dir")
    build.load_library(source)
    [so] = _files(cache, ".so")
    shard = so.parent
    for f in shard.iterdir():
        f.unlink()
    shard.rmdir()
    shard.write_bytes(b"\x00 not a directory")
    monkeypatch.setattr(build, "_loaded", {})
    with pytest.warns(RuntimeWarning, match="is damaged"):
        assert build.load_library(source).kiln_test_entry(5) == 6


_BUILD_TWO = textwrap.dedent("""
    from kiln.compiler import build
    from tests.compiler.test_cache_damage import _source
    for tag, value in (("A", 1), ("B", 100)):
        lib = build.load_library(_source(tag, value), name_hint="graph")
        print(tag, lib.kiln_test_entry(1))
""")


def _child(cache, code):
    env = {**os.environ, "KILN_CACHE_DIR": str(cache), "PYTHONPATH": str(pathlib.Path(__file__).parents[2])}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_libraries_swapped_with_their_digests_are_not_loaded_for_each_other(cache):
    """Two entries' files swapped together with their checksums (a botched sync): a fresh process
    must run each graph's own kernel (every library exports the same entry symbol)."""
    assert _child(cache, _BUILD_TWO) == ["A", "2", "B", "101"]
    (a_so, b_so), (a_digest, b_digest) = _files(cache, ".so"), _files(cache, ".sha256")
    for first, second in ((a_so, b_so), (a_digest, b_digest)):
        tmp = first.with_name("swap.tmp")
        os.replace(first, tmp)
        os.replace(second, first)
        os.replace(tmp, second)
    assert _child(cache, _BUILD_TWO) == ["A", "2", "B", "101"]


def pointwise(x):
    return (x * 3).sin() + 1


def _compile_and_check(x):
    kiln.reset()
    torch.testing.assert_close(kiln.compile(pointwise)(x), pointwise(x))


GRAPH_DAMAGES = {
    "not utf-8": lambda entry: _replace(entry, b"\xff\xfe\n\x80\x81"),
    "sealed but not an object": lambda entry: _replace(entry, graph_cache._seal([1, 2, 3])),
    "sealed without fields": lambda entry: _replace(entry, graph_cache._seal({"format": graph_cache.FORMAT})),
    "a directory": lambda entry: _make_dir(entry),
}


@pytest.mark.parametrize("damage", GRAPH_DAMAGES)
def test_a_damaged_graph_cache_entry_is_a_miss(cache, damage):
    x = torch.randn(6)
    _compile_and_check(x)
    [entry] = (cache / "graphs").rglob("*.json")
    GRAPH_DAMAGES[damage](entry)
    with pytest.warns(RuntimeWarning, match="is damaged"):
        _compile_and_check(x)
    _compile_and_check(x)  # rewritten: a hit again
    assert (graph_cache.stats.hits, graph_cache.stats.misses) == (1, 2)


def test_a_cache_dir_under_a_directory_others_may_rename_in_is_refused(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # world-writable, no sticky bit: anyone can rename our directory away
    monkeypatch.setenv("KILN_CACHE_DIR", str(shared / "me" / "kiln"))
    with pytest.raises(build.UnsafeCacheDir, match="without the sticky bit"):
        build.cache_dir()
    shared.chmod(0o1777)  # as /tmp: others cannot touch entries that are not theirs
    assert build.cache_dir() == shared / "me" / "kiln"


def test_the_checked_cache_dir_is_the_real_path(tmp_path, monkeypatch):
    """A symbolic link in the configured path is resolved before the check, and the resolved path is
    the one used: the link cannot be re-pointed between the check and a load."""
    unsafe = tmp_path / "unsafe"
    unsafe.mkdir()
    unsafe.chmod(0o777)
    (unsafe / "kiln").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(unsafe)
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "link" / "kiln"))
    with pytest.raises(build.UnsafeCacheDir, match=str(unsafe)):
        build.cache_dir()
    safe = tmp_path / "safe"
    safe.mkdir(mode=0o700)
    (safe / "kiln").mkdir(mode=0o700)
    (tmp_path / "link").unlink()
    (tmp_path / "link").symlink_to(safe)
    assert build.cache_dir() == safe / "kiln"
