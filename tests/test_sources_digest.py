"""kiln's source digests (the on-disk caches' keys hold them): a fresh process reads them from the memo
instead of hashing every source, and any change to a source file, even one that keeps its size and
mtime, gives new digests, never the memo's old ones."""
import os

import pytest

from kiln import sources_digest


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """A small stand-in for kiln's sources, a private cache, and no digests computed yet."""
    root = tmp_path / "kiln"
    (root / "compiler").mkdir(parents=True)
    (root / "__init__.py").write_text("A = 1\n")
    (root / "compiler" / "lower.py").write_text("B = 2\n")
    monkeypatch.setattr(sources_digest, "ROOT", root)
    monkeypatch.setattr(sources_digest, "_digests", {})
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    return root


def fresh_digests(monkeypatch):
    """The digests a new process would compute (the in-memory ones forgotten)."""
    monkeypatch.setattr(sources_digest, "_digests", {})
    return sources_digest.digest("kiln"), sources_digest.digest("compiler")


def refuse_to_hash(files):
    raise AssertionError("hashed the sources although the memo had them")


def test_a_second_process_reads_the_memo(tree, monkeypatch):
    first = fresh_digests(monkeypatch)
    monkeypatch.setattr(sources_digest, "_hashed", refuse_to_hash)
    assert fresh_digests(monkeypatch) == first


@pytest.mark.parametrize("where", ["__init__.py", "compiler/lower.py"])
def test_an_edit_that_keeps_size_and_mtime_changes_the_digests(tree, monkeypatch, where):
    kiln_digest, compiler_digest = fresh_digests(monkeypatch)
    path = tree / where
    st = os.stat(path)
    path.write_text(path.read_text().replace("1", "7").replace("2", "7"))  # same size
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # and the old mtime (ctime still moves)
    new_kiln, new_compiler = fresh_digests(monkeypatch)
    assert new_kiln != kiln_digest
    assert (new_compiler != compiler_digest) == where.startswith("compiler/")


def test_a_new_file_changes_the_digest(tree, monkeypatch):
    kiln_digest, _ = fresh_digests(monkeypatch)
    (tree / "extra.py").write_text("")
    assert fresh_digests(monkeypatch)[0] != kiln_digest
