"""mode="reduce-overhead": the CUDA graph runner's rules, tested without a GPU through a fake of the
CUDA graph calls (a "recording" runs the function on the static inputs; a "replay" runs it again
into the static outputs, as a real replay rewrites them). Eager is the oracle for every result and
for inputs the program mutates."""
import pytest
import torch

import kiln
from kiln.compiler import cudagraphs


class FakeGraphApi:
    def __init__(self):
        self.records, self.replays = 0, 0

    def new_pool(self):
        return object()

    def record(self, fn, static_inputs, pool):
        self.records += 1
        outputs = fn(*static_inputs)

        def replay():
            self.replays += 1
            for out, new in zip(outputs, fn(*static_inputs)):
                out.copy_(new)
        return replay, outputs


def flat(x, w):
    return (torch.relu(x @ w) + 1,)


def test_warm_up_then_record_then_replay_with_the_new_values():
    api = FakeGraphApi()
    runner = cudagraphs.CudaGraphRunner(flat, api=api)
    w = torch.randn(4, 3)
    for call in range(4):
        x = torch.randn(2, 4)
        torch.testing.assert_close(runner(x, w), flat(x, w))
        assert api.records == (0 if call == 0 else 1)
    assert api.replays == 3


def test_another_signature_records_its_own_graph():
    api = FakeGraphApi()
    runner = cudagraphs.CudaGraphRunner(flat, api=api)
    w = torch.randn(4, 3)
    shapes = [(2, 4), (5, 4), (2, 4), (5, 4), (2, 4)]
    for shape in shapes * 2:
        x = torch.randn(shape)
        torch.testing.assert_close(runner(x, w), flat(x, w))
    assert api.records == 2
    x = torch.randn(4, 2).t()  # same shape, other strides: not the recorded memory layout
    torch.testing.assert_close(runner(x, w), flat(x, w))
    assert cudagraphs.signature((x, w)) not in {cudagraphs.signature((torch.randn(2, 4), w))}


def test_results_stay_when_the_graph_replays_again():
    runner = cudagraphs.CudaGraphRunner(flat, api=FakeGraphApi())
    w = torch.randn(4, 3)
    results = [(x, runner(x, w)[0]) for x in (torch.randn(2, 4) for _ in range(5))]
    for x, out in results:
        torch.testing.assert_close(out, flat(x, w)[0])


def test_static_input_read_in_place_and_recorded_again_when_replaced():
    api = FakeGraphApi()
    runner = cudagraphs.CudaGraphRunner(flat, static_positions=[1], api=api)
    w = torch.nn.Parameter(torch.randn(4, 3), requires_grad=False)
    x = torch.randn(2, 4)
    runner(x, w), runner(x, w)
    with torch.no_grad():
        w.mul_(2)  # changed in place: the graph reads it where it is
    torch.testing.assert_close(runner(x, w), flat(x, w))
    assert api.records == 1
    w2 = torch.nn.Parameter(torch.randn(4, 3), requires_grad=False)  # another tensor: record again
    runner(x, w2)
    torch.testing.assert_close(runner(x, w2), flat(x, w2))
    assert api.records == 2


def test_a_failed_recording_runs_without_graphs():
    class Failing(FakeGraphApi):
        def record(self, fn, static_inputs, pool):
            raise RuntimeError("operation not permitted when stream is capturing")
    runner = cudagraphs.CudaGraphRunner(flat, api=Failing())
    w = torch.randn(4, 3)
    for _ in range(3):
        x = torch.randn(2, 4)
        torch.testing.assert_close(runner(x, w), flat(x, w))


@pytest.fixture
def fake_cuda_graphs(monkeypatch):
    """reduce-overhead on CPU graphs: the blocker lets CPU buffers through, the fake API records."""
    api = FakeGraphApi()
    monkeypatch.setattr(cudagraphs, "blocker", lambda program, compiled=(): None)
    monkeypatch.setattr(cudagraphs, "GraphApi", lambda: api)
    return api


def test_reduce_overhead_mutated_inputs_and_guards(fake_cuda_graphs):
    def fn(x, y):
        x.mul_(2)
        return (x + y).sin()
    kiln.reset()
    compiled = kiln.compile(fn, mode="reduce-overhead")
    for dtype in (torch.float32, torch.float32, torch.float32, torch.float64, torch.float64, torch.float32):
        x, y = torch.randn(3, 5, dtype=dtype), torch.randn(3, 5, dtype=dtype)
        x_eager = x.clone()
        torch.testing.assert_close(compiled(x, y), fn(x_eager, y))
        torch.testing.assert_close(x, x_eager)  # the input written as eager writes it
    # one recording per compiled entry (the float64 call failed the dtype guard: its own entry)
    assert fake_cuda_graphs.records == 2


def test_training_step_replays_forward_and_backward(fake_cuda_graphs):
    # the forward and the backward graph are each recorded once and replayed: the loss and every
    # gradient as eager's, step after step (outputs are copies: saved tensors outlive a replay)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    twin = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    twin.load_state_dict(model.state_dict())
    kiln.reset()
    compiled = kiln.compile(model, mode="reduce-overhead")
    for step in range(4):
        x = torch.randn(5, 6)
        loss = compiled(x).square().mean()
        expected = twin(x).square().mean()
        loss.backward()
        expected.backward()
        torch.testing.assert_close(loss, expected)
        for p, q in zip(model.parameters(), twin.parameters()):
            torch.testing.assert_close(p.grad, q.grad)
    assert fake_cuda_graphs.records == 2 and fake_cuda_graphs.replays >= 4


def test_random_ops_and_cpu_buffers_are_never_recorded():
    def program_of(fn, *args):
        from kiln.compiler import aot
        from kiln.compiler.lower import GraphLowering
        from kiln.compiler.schedule import build_program
        from kiln.config import compiler_options
        aten = aot.trace_aten(torch.fx.symbolic_trace(fn), list(args))
        graph = GraphLowering(aten.gm, list(args), compiler_options()).run()
        return build_program(graph)
    assert "on cpu" in cudagraphs.blocker(program_of(lambda x: x + 1, torch.randn(3)))
    with torch.device("meta"):
        x = torch.empty(3)
    assert "random op" in cudagraphs.blocker(program_of(lambda x: x + torch.rand_like(x), x))
