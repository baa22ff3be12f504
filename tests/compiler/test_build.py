"""The C++ build and its disk cache: hits, damaged files, concurrent builders, unsafe directories."""
import ctypes
import os
import subprocess
import sys
import textwrap

import pytest

from kiln.compiler import build

SOURCE = 'extern "C" int add_one(int x) { return x + 1; }\n'


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh private cache directory and fresh counters for each test."""
    path = tmp_path / "cache"
    monkeypatch.setenv("KILN_CACHE_DIR", str(path))
    monkeypatch.setattr(build, "stats", build.CacheStats())
    monkeypatch.setattr(build, "_loaded", {})
    return path


def unique_source(tag):
    """A source no other test builds, so each test starts cold."""
    return SOURCE + f"// {tag}\n"


def library_files(cache, suffix):
    return sorted((cache / "cpp").rglob(f"*{suffix}"))


def forget_loaded(monkeypatch):
    """Drop the in-process memo so the next load goes to disk, as a fresh process would."""
    monkeypatch.setattr(build, "_loaded", {})


def test_builds_and_loads(cache):
    lib = build.load_library(unique_source("basic"), name_hint="my kernel!")
    assert lib.add_one(41) == 42
    assert build.stats.builds == 1
    [so] = library_files(cache, ".so")
    assert so.name.startswith("my_kernel_")
    assert (cache.stat().st_mode & 0o777) == 0o700


def test_second_load_hits_memory_then_disk(cache, monkeypatch):
    source = unique_source("hits")
    first = build.load_library(source)
    assert build.load_library(source) is first
    assert build.stats.memory_hits == 1
    forget_loaded(monkeypatch)
    assert build.load_library(source).add_one(1) == 2
    assert (build.stats.builds, build.stats.disk_hits) == (1, 1)


def test_key_covers_source_and_flags(cache):
    build.load_library(unique_source("key"))
    build.load_library(unique_source("key") + "// changed\n")
    build.load_library(unique_source("key"), extra_flags=("-DKILN_TEST=1",))
    assert build.stats.builds == 3
    assert len(library_files(cache, ".so")) == 3


def replace_file(path, data):
    """Write a new file over `path` (a new inode: this process still maps the old library, and
    rewriting a mapped file in place would crash it)."""
    tmp = path.with_suffix(".damaged")
    tmp.write_bytes(data)
    os.replace(tmp, path)


@pytest.mark.parametrize("damage", ["truncate", "garbage", "flip_byte", "delete_digest"])
def test_damaged_library_is_rebuilt(cache, monkeypatch, damage):
    source = unique_source(f"damaged {damage}")
    build.load_library(source)
    [so] = library_files(cache, ".so")
    data = so.read_bytes()
    if damage == "truncate":
        replace_file(so, data[: len(data) // 3])
    elif damage == "garbage":
        replace_file(so, b"not a shared library")
    elif damage == "flip_byte":  # still loads, but is not what was built
        replace_file(so, data[:-10] + bytes([data[-10] ^ 0xFF]) + data[-9:])
    else:
        [digest] = library_files(cache, ".sha256")
        digest.unlink()
    forget_loaded(monkeypatch)
    assert build.load_library(source).add_one(2) == 3
    assert build.stats.builds == 2
    assert so.read_bytes() == data


def test_compile_error_shows_source_path_and_stderr(cache):
    with pytest.raises(build.CompileError) as info:
        build.load_library('extern "C" int broken( { return; }\n', name_hint="broken")
    error = info.value
    assert error.source_path.exists() and error.source_path.suffix == ".cpp"
    assert str(error.source_path) in str(error)
    assert "error" in str(error)
    assert "broken(" in error.source_path.read_text()
    assert not library_files(cache, ".so")


def test_refuses_a_world_writable_cache_dir(cache):
    cache.mkdir(mode=0o700)
    cache.chmod(0o777)
    with pytest.raises(build.UnsafeCacheDir, match="writable by group or others"):
        build.load_library(unique_source("unsafe"))
    assert not (cache / "cpp").exists()


def test_refuses_a_cache_dir_owned_by_another_user(cache):
    if os.getuid() != 0:
        pytest.skip("making a directory owned by another user needs root")
    cache.mkdir(mode=0o700)
    os.chown(cache, 65534, 65534)
    with pytest.raises(build.UnsafeCacheDir, match="owned by uid 65534"):
        build.cache_dir()


def test_default_cache_dir_is_under_the_user_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("KILN_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert build.cache_dir() == tmp_path / "kiln"
    assert (build.cache_dir().stat().st_mode & 0o777) == 0o700


BUILDER = textwrap.dedent("""
    import sys
    from kiln.compiler import build
    lib = build.load_library(sys.argv[1])
    assert lib.add_one(1) == 2
    print(build.stats.builds, build.stats.disk_hits)
""")


def test_concurrent_builds_from_two_processes(cache):
    # A slow-to-compile source widens the window in which both processes want the library.
    source = unique_source("concurrent") + "".join(
        f'extern "C" double f{i}(double x) {{ double s = 0; for (int k = 0; k < {i + 3}; ++k) s += x * k; return s; }}\n'
        for i in range(300))
    env = {**os.environ, "KILN_CACHE_DIR": str(cache)}
    procs = [subprocess.Popen([sys.executable, "-c", BUILDER, source], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, results):
        assert p.returncode == 0, err
    counts = sorted(tuple(map(int, out.split())) for out, _ in results)
    assert counts == [(0, 1), (1, 0)]  # one built it, the other waited and loaded it
    [so] = library_files(cache, ".so")
    ctypes.CDLL(str(so))
    assert not library_files(cache, ".tmp")
