"""A WeakKeyDictionary of objects compared by identity (modules), read in the frame: `in` and `[k]`
through its Python methods over its dict of weak references, guarded on those keys, so a key removed
later recompiles rather than answering from the old contents."""
import weakref

import torch

import kiln
from tests.utils import CompileCounter


def test_membership_and_lookup_in_a_weak_key_dictionary():
    states = weakref.WeakKeyDictionary()
    a, b, c = torch.nn.Module(), torch.nn.Module(), torch.nn.Module()
    states[a], states[b] = 2, 3

    def fn(x):
        if a in states:
            x = x.sin()
        if c in states:
            x = x.cos()
        return x * states[b]

    counter = CompileCounter()
    compiled = kiln.compile(fn, backend=counter, fullgraph=True)
    x = torch.randn(4)
    torch.testing.assert_close(compiled(x), fn(x))
    assert counter.frame_count == 1
    del states[a]
    states[c] = 5
    torch.testing.assert_close(compiled(x), fn(x))
    assert counter.frame_count == 2
