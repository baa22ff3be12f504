"""transformers' ModelOutput made in a compiled frame: the rebuilt object holds eager's state (its
items in order, its fields as attributes), restored without calling the class again where the class
is shown to make just that state (capture/data_dicts), and by calling it where it is not."""
import dataclasses
from typing import Optional

import pytest
import torch

import kiln

transformers = pytest.importorskip("transformers")
from transformers.modeling_outputs import BaseModelOutputWithPooling, Seq2SeqModelOutput  # noqa: E402
from transformers.utils import ModelOutput  # noqa: E402


@dataclasses.dataclass
class CountedOutput(ModelOutput):
    """A ModelOutput whose __post_init__ adds state of its own: the glue must call the class."""
    hidden: Optional[torch.Tensor] = None
    extra: Optional[torch.Tensor] = None

    def __post_init__(self):
        super().__post_init__()
        self.__dict__["doubled"] = True


def pooled(x):
    return BaseModelOutputWithPooling(last_hidden_state=x * 2, pooler_output=x.sum(0), hidden_states=None,
                                      attentions=None)


def pooled_then_set(x):
    out = BaseModelOutputWithPooling(last_hidden_state=x * 2)
    out["attentions"] = (x + 1,)  # a later field set last: items in the order the frame set them
    out["pooler_output"] = x.sum(0)
    return out


def seq2seq(x):
    return Seq2SeqModelOutput(last_hidden_state=x.relu(), encoder_last_hidden_state=x - 1)


def counted(x):
    return CountedOutput(hidden=x * 3, extra=x.sin())


def assert_same_output(actual, expected):
    assert type(actual) is type(expected)
    assert list(actual.keys()) == list(expected.keys())
    for k in expected.keys():
        torch.testing.assert_close(actual[k], expected[k])
    assert list(vars(actual)) == list(vars(expected))
    for k, v in vars(expected).items():
        assert (vars(actual)[k] is None) == (v is None), k
        if isinstance(v, torch.Tensor):
            torch.testing.assert_close(vars(actual)[k], v)
            assert getattr(actual, k) is actual[k]  # one tensor, item and attribute alike
    assert len(actual.to_tuple()) == len(expected.to_tuple())


@pytest.mark.parametrize("fn", [pooled, pooled_then_set, seq2seq], ids=lambda f: f.__name__)
def test_model_output_is_restored_with_eager_state(fn):
    kiln.reset()
    x = torch.randn(4, 3)
    compiled = kiln.compile(fn, backend="eager")
    assert_same_output(compiled(x), fn(x))
    assert_same_output(compiled(x), fn(x))  # (the entry's own glue, the second time)
    glue = compiled.__kiln_compiled__._kiln_cache.entries[0].glue_src
    assert "RESTORE" in glue and "CLS" in glue


def test_model_output_with_state_of_its_own_calls_its_class():
    kiln.reset()
    x = torch.randn(4, 3)
    compiled = kiln.compile(counted, backend="eager")
    out = compiled(x)
    assert_same_output(out, counted(x))
    assert out.doubled is True
    assert "RESTORE" not in compiled.__kiln_compiled__._kiln_cache.entries[0].glue_src


def test_model_output_of_a_compiled_model_is_restored():
    kiln.reset()

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)

        def forward(self, x):
            h = self.lin(x)
            return BaseModelOutputWithPooling(last_hidden_state=h, pooler_output=h.tanh().mean(0))

    model = Model()
    x = torch.randn(2, 3)
    compiled = kiln.compile(model)
    with torch.no_grad():
        assert_same_output(compiled(x), model(x))
        assert_same_output(compiled(x), model(x))
