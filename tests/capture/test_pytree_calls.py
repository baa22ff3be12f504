"""torch.utils._pytree in user code (tree_flatten / tree_unflatten / tree_map, as HF Mamba's scan and
many training loops use it): its TreeSpec is a plain Python class of torch's, followed like user code,
so flattening a structure of tensors costs no graph break (it broke on "constructing TreeSpec", and
inside a loop that ran the whole frame eagerly)."""
import torch
import torch.utils._pytree as pytree

from tests.utils import check_graphs


def round_trip(x, y):
    leaves, spec = pytree.tree_flatten((x, {"a": y, "b": [x, 3]}))
    doubled = [leaf * 2 if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]
    return pytree.tree_unflatten(doubled, spec), spec.num_leaves, spec


def test_flatten_and_unflatten_are_one_graph_and_the_spec_equals_eager():
    check_graphs(round_trip, torch.randn(3), torch.randn(2, 3), graphs=1, fullgraph=True)


def test_tree_map_in_a_loop_is_one_graph():
    def f(x, y):
        state = {"h": x, "c": [y, y + 1]}
        for _ in range(3):
            state = pytree.tree_map(lambda t: t.sin() + 1, state)
        return state
    check_graphs(f, torch.randn(4), torch.randn(4), graphs=1, fullgraph=True)


def test_a_spec_made_before_a_graph_break_is_used_after_it():
    def f(x, y):
        leaves, spec = pytree.tree_flatten((x, [y, {"k": y}]))
        print("a graph break")
        return pytree.tree_unflatten([leaf + 1 for leaf in leaves], spec), spec
    check_graphs(f, torch.randn(3), torch.randn(3), graphs=1)
